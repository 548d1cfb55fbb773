package app

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kproxy/kproxy/pkg/config"
)

// newClient builds an API server client from the connection settings: the
// kubeconfig (or the in-cluster configuration when none is given), with
// --master overriding its server. server is the API server's address, for
// messages.
func newClient(cc config.ClientConnection) (client kubernetes.Interface, server string, err error) {
	rc, err := clientcmd.BuildConfigFromFlags(cc.Master, cc.Kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("building the API server client configuration (kubeconfig %q, master %q): %w", cc.Kubeconfig, cc.Master, err)
	}
	rc.UserAgent = "kproxy"
	if cc.ContentType != "" {
		rc.ContentType = cc.ContentType
	}
	if cc.AcceptContentTypes != "" {
		rc.AcceptContentTypes = cc.AcceptContentTypes
	}
	if cc.QPS > 0 {
		rc.QPS = cc.QPS
	}
	if cc.Burst > 0 {
		rc.Burst = cc.Burst
	}
	client, err = kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("creating the API server client: %w", err)
	}
	return client, rc.Host, nil
}
