package controlplane

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Token returns the bearer token of id.
func (cp *ControlPlane) Token(id Identity) (string, error) {
	switch id {
	case Admin:
		return cp.AdminToken, nil
	case Kproxy:
		return cp.KproxyToken, nil
	default:
		return "", fmt.Errorf("unknown control-plane identity %q (want %q or %q)", id, Admin, Kproxy)
	}
}

// UserKubeconfig renders a kubeconfig file for one of Options.Users, as
// Kubeconfig does for an Identity.
func (cp *ControlPlane) UserKubeconfig(name string) ([]byte, error) {
	token, ok := cp.UserTokens[name]
	if !ok {
		return nil, fmt.Errorf("no control-plane user %q (Options.Users)", name)
	}
	return cp.kubeconfig(name, token)
}

// Kubeconfig renders a kubeconfig file for id: one cluster (URL, CA data),
// one user (bearer token), one current context. A process in a namespace that
// can route to ListenIP uses it as is (kproxy --kubeconfig).
func (cp *ControlPlane) Kubeconfig(id Identity) ([]byte, error) {
	token, err := cp.Token(id)
	if err != nil {
		return nil, err
	}
	return cp.kubeconfig(string(id), token)
}

func (cp *ControlPlane) kubeconfig(user, token string) ([]byte, error) {
	const cluster = "kproxy-test"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.CAPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	cfg.CurrentContext = user
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering kubeconfig for %s: %w", user, err)
	}
	return out, nil
}

// RESTConfig is a client-go configuration for id that dials through
// Options.Dial, so a client in this process reaches the API server in its
// namespace.
func (cp *ControlPlane) RESTConfig(id Identity) (*rest.Config, error) {
	token, err := cp.Token(id)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            cp.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), cp.CAPEM...)},
		Dial:            cp.opts.Dial,
	}, nil
}
