package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/cmd/internal/explaincmd"
	"github.com/kproxy/kproxy/pkg/app"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
)

const explainUsage = `Usage: kubectl kproxy explain NODE --to ADDRESS:PORT[/tcp|udp|sctp] [--from ADDRESS | --from-node | --from-outside] [-o text|json]

Tells where a new connection to a Service address goes on node NODE, and
why, as 'kproxy explain' does on the node, without a shell there: the
frontend matched, the verdict (DNAT to endpoints with their chances, REJECT,
DROP, not handled), masquerade, the policies that decided, and the path
through the rules, chains or HNS load balancers kproxy plans for that node.
The node's mode and configuration are those of its kproxy pod (the
container's flags and the ConfigMap the pod mounts), the Node, Services and
EndpointSlices the API server's. It is the plan; 'kproxy explain --live' on
the node compares it with what is programmed.

The client: a pod on the node (default; an address of the node's pod CIDR),
the node itself (--from-node), or a host elsewhere (--from-outside; default
client 203.0.113.10 or 2001:db8::10, documentation addresses). --from sets
the address.

Examples:
  kubectl kproxy explain node1 --to 10.96.0.10:53/udp
  kubectl kproxy explain node1 --from-outside --to 192.168.1.10:30080
  kubectl kproxy explain node1 --from 10.244.1.7 --to 10.96.0.1:443 -o json

Flags:
`

func runExplain(ctx context.Context, args []string, conn *connection, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kubectl kproxy explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var f explaincmd.Flags
	f.AddFlags(fs, false)
	conn.addFlags(fs)
	fs.Usage = func() { _, _ = io.WriteString(stdout, explainUsage+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 1
	}
	fail := func(err error) int {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy explain: %v\n", err)
		return 1
	}
	if fs.NArg() != 1 {
		return fail(errors.New("give one NODE (kubectl get nodes lists them), then --to ADDRESS:PORT"))
	}
	if _, _, err := f.Check(); err != nil {
		return fail(err)
	}
	client, err := conn.client()
	if err != nil {
		return fail(err)
	}
	return explainNode(ctx, f, fs.Arg(0), conn, client, stdout, fail)
}

func explainNode(ctx context.Context, f explaincmd.Flags, node string, conn *connection, client kubernetes.Interface, stdout io.Writer, fail func(error) int) int {
	dir, err := os.MkdirTemp("", "kubectl-kproxy-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	o, err := NodeOptions(ctx, client, conn.namespace, node, dir)
	if err != nil {
		return fail(err)
	}
	read := func(ctx context.Context, o *config.Options) (*proxy.Snapshot, error) {
		return app.SnapshotFrom(ctx, o, client, conn.host)
	}
	if err := explaincmd.Run(ctx, o, f, fmt.Sprintf("node %q", node), read, stdout); err != nil {
		return fail(err)
	}
	return 0
}

// NodeOptions is the configuration of node's kproxy, as its pod in
// namespace runs it: the kproxy container's flags ($(VAR) references to its
// environment expanded), the file --config names read from the ConfigMap
// volume mounted there (written into dir), defaults of the node's OS. The
// result is validated for a planned explanation: NodeName is node, DryRun
// set (nothing is programmed).
func NodeOptions(ctx context.Context, client kubernetes.Interface, namespace, node, dir string) (*config.Options, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	pod, err := nodePod(ctx, client, namespace, node)
	if err != nil {
		return nil, err
	}
	c := kproxyContainer(pod)
	if c == nil {
		return nil, fmt.Errorf("pod %s/%s has no containers", pod.Namespace, pod.Name)
	}
	goos := n.Labels[v1.LabelOSStable]
	if goos == "" {
		goos = pod.Spec.NodeSelector[v1.LabelOSStable]
	}
	if goos == "" {
		goos = "linux"
	}
	o := config.NewOptionsFor(goos)
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	args := expandEnv(kproxyArgs(c), c, pod)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("pod %s/%s, container %s: its arguments %q: %w", pod.Namespace, pod.Name, c.Name, args, err)
	}
	if o.ConfigFile != "" {
		data, from, err := mountedFile(ctx, client, pod, c, o.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: --config %s: %w", pod.Namespace, pod.Name, o.ConfigFile, err)
		}
		file := filepath.Join(dir, "config.conf")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			return nil, err
		}
		o.ConfigFile = file
		if err := o.Complete(fs); err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
	} else if err := o.Complete(fs); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	o.NodeName = node
	o.DryRun = true
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("node %q's kproxy configuration: %w", node, err)
	}
	return o, nil
}

// nodePod is the kproxy pod on node (the newest, during a rollout).
func nodePod(ctx context.Context, client kubernetes.Interface, namespace, node string) (*v1.Pod, error) {
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("%s in (%s,%s)", appLabel, linuxApp, windowsApp),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing kproxy's pods in %s: %w", namespace, err)
	}
	var pod *v1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		if pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time) {
			pod = p
		}
	}
	if pod == nil {
		return nil, fmt.Errorf("no kproxy pod on node %q in namespace %s (pods labelled %s=%s or %s; -n names another namespace)",
			node, namespace, appLabel, linuxApp, windowsApp)
	}
	return pod, nil
}

// kproxyContainer is the pod's container named kproxy, else its first.
func kproxyContainer(pod *v1.Pod) *v1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "kproxy" {
			return &pod.Spec.Containers[i]
		}
	}
	if len(pod.Spec.Containers) > 0 {
		return &pod.Spec.Containers[0]
	}
	return nil
}

// kproxyArgs are kproxy's arguments in c: the command's after the kproxy
// binary when the command runs it directly, then the container's args (on
// Windows the command is a PowerShell script that passes them on).
func kproxyArgs(c *v1.Container) []string {
	var args []string
	if len(c.Command) > 1 && strings.TrimSuffix(path.Base(filepath.ToSlash(c.Command[0])), ".exe") == "kproxy" {
		args = append(args, c.Command[1:]...)
	}
	return append(args, c.Args...)
}

// expandEnv expands $(NAME) in args as the kubelet does, for the variables
// of c whose value is known here: literal values and the pod's spec.nodeName,
// metadata.name and metadata.namespace. $$ is a literal $; other
// references are left as they are.
func expandEnv(args []string, c *v1.Container, pod *v1.Pod) []string {
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "spec.nodeName":
				vars[e.Name] = pod.Spec.NodeName
			case "metadata.name":
				vars[e.Name] = pod.Name
			case "metadata.namespace":
				vars[e.Name] = pod.Namespace
			}
		}
	}
	out := make([]string, len(args))
	for i, a := range args {
		var b strings.Builder
		for j := 0; j < len(a); j++ {
			if a[j] != '$' || j+1 >= len(a) {
				b.WriteByte(a[j])
				continue
			}
			if a[j+1] == '$' {
				b.WriteByte('$')
				j++
				continue
			}
			if a[j+1] == '(' {
				if end := strings.IndexByte(a[j+2:], ')'); end >= 0 {
					if v, ok := vars[a[j+2:j+2+end]]; ok {
						b.WriteString(v)
						j += 2 + end
						continue
					}
				}
			}
			b.WriteByte(a[j])
		}
		out[i] = b.String()
	}
	return out
}

// mountedFile reads the file at file in container c of pod from the
// ConfigMap volume mounted at its directory (or above it); from names where
// it was read.
func mountedFile(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, c *v1.Container, file string) (data []byte, from string, err error) {
	file = path.Clean(filepath.ToSlash(file))
	for _, m := range c.VolumeMounts {
		mount := path.Clean(filepath.ToSlash(m.MountPath))
		rel := strings.TrimPrefix(file, mount+"/")
		if rel == file {
			continue
		}
		if m.SubPath != "" {
			rel = path.Join(m.SubPath, rel)
		}
		vol := podVolume(pod, m.Name)
		if vol == nil || vol.ConfigMap == nil {
			return nil, "", fmt.Errorf("mounted from volume %q, which is not a ConfigMap: this plugin reads only ConfigMaps", m.Name)
		}
		key := rel
		if len(vol.ConfigMap.Items) > 0 {
			key = ""
			for _, it := range vol.ConfigMap.Items {
				if path.Clean(it.Path) == rel {
					key = it.Key
				}
			}
			if key == "" {
				return nil, "", fmt.Errorf("ConfigMap volume %q projects no item at %s", m.Name, rel)
			}
		}
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vol.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("reading ConfigMap %s/%s: %w", pod.Namespace, vol.ConfigMap.Name, err)
		}
		v, ok := cm.Data[key]
		if !ok {
			return nil, "", fmt.Errorf("ConfigMap %s/%s has no key %q", pod.Namespace, cm.Name, key)
		}
		return []byte(v), fmt.Sprintf("ConfigMap %s/%s key %s", pod.Namespace, cm.Name, key), nil
	}
	return nil, "", errors.New("no volume of the container is mounted there")
}

func podVolume(pod *v1.Pod, name string) *v1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}
