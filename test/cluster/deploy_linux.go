package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/hack/image/oci"
)

// kubectl runs kubectl (with the admin kubeconfig) in the control plane's
// network namespace, from dir, with stdin when given; the output is in
// the error.
type kubectlFunc func(ctx context.Context, dir string, stdin string, args ...string) ([]byte, error)

func newKubectl(bin, cpNS, kubeconfig string) kubectlFunc {
	return func(ctx context.Context, dir, stdin string, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + cpNS, "--", bin, "--kubeconfig", kubeconfig}, args...)...)
		cmd.Dir = dir
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return out, nil
	}
}

// setPodCIDRs waits for every node to register and sets its pod CIDR (the
// one its CNI configuration and the routes of test/netns use), as the node
// IPAM controller would.
func setPodCIDRs(ctx context.Context, cs kubernetes.Interface, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for _, n := range Nodes {
		for {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil {
				if node.Spec.PodCIDR == "" {
					patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.PodCIDR, n.PodCIDR)
					if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
						return fmt.Errorf("setting the pod CIDR of %s: %w", n.Name, err)
					}
				}
				break
			}
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("node %s did not register within %v (its kubelet log: %s)", n.Name, limit, "<dir>/"+n.Name+"/kubelet.log")
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// waitNodesReady waits for every node's Ready condition.
func waitNodesReady(ctx context.Context, cs kubernetes.Interface, limit time.Duration) error {
	return poll(ctx, limit, func(ctx context.Context) (bool, string, error) {
		var notReady []string
		for _, n := range Nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				notReady = append(notReady, n.Name+": "+err.Error())
				continue
			}
			ready := false
			for _, c := range node.Status.Conditions {
				if c.Type == v1.NodeReady {
					ready = c.Status == v1.ConditionTrue
					if !ready {
						notReady = append(notReady, n.Name+": "+c.Reason+" "+c.Message)
					}
				}
			}
			if !ready && len(notReady) == 0 {
				notReady = append(notReady, n.Name+": no Ready condition yet")
			}
		}
		return len(notReady) == 0, strings.Join(notReady, "; "), nil
	})
}

// waitPodsReady waits until, in namespace ns, the pods with selector are
// Ready, want of them (at least one per node when want is 0).
func waitPodsReady(ctx context.Context, cs kubernetes.Interface, ns, selector string, want int, limit time.Duration) error {
	if want == 0 {
		want = len(Nodes)
	}
	return poll(ctx, limit, func(ctx context.Context) (bool, string, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error(), nil
		}
		ready := 0
		var states []string
		for _, p := range pods.Items {
			ok := false
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
					ok = true
				}
			}
			if ok {
				ready++
			}
			states = append(states, podState(&p))
		}
		return ready >= want, fmt.Sprintf("%d/%d ready: %s", ready, want, strings.Join(states, ", ")), nil
	})
}

// podState summarizes a pod for progress messages.
func podState(p *v1.Pod) string {
	s := p.Name + " on " + p.Spec.NodeName + " " + string(p.Status.Phase)
	for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch {
		case c.State.Waiting != nil:
			s += " " + c.Name + ":" + c.State.Waiting.Reason
		case c.State.Terminated != nil && c.State.Terminated.ExitCode != 0:
			s += fmt.Sprintf(" %s:exit %d", c.Name, c.State.Terminated.ExitCode)
		}
		if c.RestartCount > 0 {
			s += fmt.Sprintf(" (%s restarted %d)", c.Name, c.RestartCount)
		}
	}
	return s
}

// poll calls check every second until it reports done, returns an error,
// or limit passes (the error then carries check's last message).
func poll(ctx context.Context, limit time.Duration, check func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	last := ""
	for {
		done, msg, err := check(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		last = msg
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %s", limit, last)
		case <-time.After(time.Second):
		}
	}
}

// imageRef reads the name ctr gives an OCI archive (its
// io.containerd.image.name annotation).
func imageRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	desc, _, _, err := oci.ReadArchive(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", archive, err)
	}
	ref := desc.Annotations["io.containerd.image.name"]
	if ref == "" {
		return "", fmt.Errorf("%s names no image (io.containerd.image.name)", archive)
	}
	return ref, nil
}

// saveKubeProxyConfigMap runs docs/install.md's commands that save the
// cluster's kube-proxy ConfigMap into the kubeadm overlay, as written there.
func saveKubeProxyConfigMap(ctx context.Context, deployCopy, kubectlWrapperDir string) error {
	script := `d=deploy/overlays/kubeadm/kube-proxy
{ echo 'metadata: {name: kube-proxy}'; kubectl -n kube-system get configmap kube-proxy -o jsonpath='{.data.config\.conf}'; } > "$d/config.yaml"
{ echo 'metadata: {name: kube-proxy}'; kubectl -n kube-system get configmap kube-proxy -o jsonpath='{.data.kubeconfig\.conf}'; } > "$d/kubeconfig.yaml"
`
	cmd := exec.CommandContext(ctx, "bash", "-ec", script)
	cmd.Dir = filepath.Dir(deployCopy)
	cmd.Env = append(os.Environ(), "PATH="+kubectlWrapperDir+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("saving the kube-proxy ConfigMap into the kubeadm overlay: %w: %s", err, out)
	}
	for _, f := range []string{"config.yaml", "kubeconfig.yaml"} {
		data, err := os.ReadFile(filepath.Join(deployCopy, "overlays", "kubeadm", "kube-proxy", f))
		if err != nil {
			return err
		}
		if len(strings.TrimSpace(string(data))) <= len("metadata: {name: kube-proxy}") {
			return errors.New("the kube-proxy ConfigMap saved into the kubeadm overlay is empty")
		}
	}
	return nil
}

// podCIDRRoutes are the control plane's routes to the pods (via each node),
// for kube-apiserver's webhooks and aggregated APIs, which it reaches at
// their endpoints.
func podCIDRRoutes() []string {
	var out []string
	for _, n := range Nodes {
		out = append(out, fmt.Sprintf("route add %s via %s", n.PodCIDR, n.IP))
	}
	return out
}
