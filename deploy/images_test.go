package deploy

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/kproxy/kproxy/hack/image"
	"github.com/kproxy/kproxy/pkg/config"
)

// dockerfile is the part of a Dockerfile these tests look at.
type dockerfile struct {
	goVersion string   // ARG GO_VERSION default
	final     []string // instructions of the last stage, continuation lines joined
}

func readDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur += s + " "
			continue
		}
		if l = strings.TrimSpace(cur + l); l != "" {
			lines = append(lines, l)
		}
		cur = ""
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "ARG GO_VERSION="); ok {
			d.goVersion = v
		}
		if strings.HasPrefix(l, "FROM ") {
			d.final = nil
		}
		d.final = append(d.final, l)
	}
	return d
}

func (d dockerfile) has(re string) bool {
	r := regexp.MustCompile(re)
	for _, l := range d.final {
		if r.MatchString(l) {
			return true
		}
	}
	return false
}

// goMinor returns "1.26" for the module's "go 1.26.8".
func goMinor(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

func TestLinuxImage(t *testing.T) {
	d := readDockerfile(t, "linux/Dockerfile")
	if d.goVersion != goMinor(t) {
		t.Errorf("builds with Go %q, go.mod says %s", d.goVersion, goMinor(t))
	}
	r := renderMain(t)
	cmd := proxyContainer(r.daemonSet(t, linuxDaemonSet)).Command
	if len(cmd) == 0 {
		t.Fatal("the DaemonSet gives no command")
	}
	for _, re := range []string{
		// Both flavours' tools (the iptables package has iptables-legacy*
		// and iptables-nft*), nft, ipset (--cleanup of kube-proxy's ipvs
		// mode) and modprobe.
		`^RUN .*apt-get install .*\biptables\b`,
		`^RUN .*apt-get install .*\bnftables\b`,
		`^RUN .*apt-get install .*\bipset\b`,
		`^RUN .*apt-get install .*\bkmod\b`,
		// ... checked while building, so a base image without them fails.
		`iptables-legacy|\$t-\$f\$s`,
		`command -v ipset\b`,
		`^COPY --from=\S+ \S+ ` + regexp.QuoteMeta(cmd[0]) + `$`,
		// kube-proxy's path, for DaemonSets that only swap the image.
		`^RUN ln -s kproxy /usr/local/bin/kube-proxy$`,
	} {
		if !d.has(re) {
			t.Errorf("linux/Dockerfile's image stage has no line matching %s:\n%s", re, strings.Join(d.final, "\n"))
		}
	}
}

// TestLinuxImagesAgree: the Dockerfile installs the packages make images
// puts in its image (hack/image), but dash, which debian:bookworm-slim has.
func TestLinuxImagesAgree(t *testing.T) {
	d := readDockerfile(t, "linux/Dockerfile")
	var installed []string
	for _, l := range d.final {
		if _, rest, ok := strings.Cut(l, "apt-get install -y --no-install-recommends "); ok {
			rest, _, _ = strings.Cut(rest, "&&")
			installed = strings.Fields(rest)
		}
	}
	var want []string
	for _, p := range image.Packages {
		if p != "dash" {
			want = append(want, p)
		}
	}
	sort.Strings(installed)
	sort.Strings(want)
	if strings.Join(installed, " ") != strings.Join(want, " ") {
		t.Errorf("linux/Dockerfile installs %v, make images' image has %v (and dash)", installed, want)
	}
}

func TestWindowsImage(t *testing.T) {
	d := readDockerfile(t, "windows/Dockerfile")
	if d.goVersion != goMinor(t) {
		t.Errorf("builds with Go %q, go.mod says %s", d.goVersion, goMinor(t))
	}
	script, err := os.ReadFile("windows/start.ps1")
	if err != nil {
		t.Fatal(err)
	}
	r := renderMain(t)
	ds := r.daemonSet(t, windowsDaemonSet)
	c := proxyContainer(ds)
	cmdline := strings.Join(c.Command, " ")
	for _, tc := range []struct{ what, re string }{
		{"the image holds start.ps1 where the DaemonSet runs it",
			`^COPY deploy/windows/start\.ps1 /kproxy/start\.ps1$`},
		{"the image holds kproxy.exe where start.ps1 runs it",
			`^COPY --from=\S+ /out/kproxy\.exe /kproxy/kproxy\.exe$`},
		{"the image holds kube-proxy.exe where kube-proxy DaemonSets run it",
			`^COPY --from=\S+ /out/kproxy\.exe /kube-proxy/kube-proxy\.exe$`},
		{"the image holds kube-proxy.exe next to kproxy.exe",
			`^COPY --from=\S+ /out/kproxy\.exe /kproxy/kube-proxy\.exe$`},
		{"the base is the HostProcess base image",
			`^FROM mcr\.microsoft\.com/oss/kubernetes/windows-host-process-containers-base-image:`},
	} {
		if !d.has(tc.re) {
			t.Errorf("windows/Dockerfile: %s: no line matching %s", tc.what, tc.re)
		}
	}
	if !strings.Contains(cmdline, "$env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/start.ps1'") {
		t.Errorf("the DaemonSet's command %q does not run kproxy/start.ps1 from the container's mount point", cmdline)
	}
	if !strings.Contains(string(script), "$env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/kproxy.exe'") {
		t.Errorf("start.ps1 does not run kproxy/kproxy.exe from the container's mount point")
	}

	// Every flag start.ps1 adds is one of kproxy's, and every environment
	// variable it reads is set by the DaemonSet or optional by design.
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	for _, m := range regexp.MustCompile(`"--([a-z-]+)=`).FindAllStringSubmatch(string(script), -1) {
		if fs.Lookup(m[1]) == nil {
			t.Errorf("start.ps1 passes --%s, which kproxy does not have", m[1])
		}
	}
	optional := map[string]bool{"SOURCE_VIP": true, "SOURCE_VIP_FILE": true, "CONTAINER_SANDBOX_MOUNT_POINT": true, "TEMP": true}
	for _, m := range regexp.MustCompile(`\$env:([A-Z_]+)`).FindAllStringSubmatch(string(script), -1) {
		if !optional[m[1]] && envValue(c, m[1]) == "" {
			t.Errorf("start.ps1 reads $env:%s, which the DaemonSet does not set", m[1])
		}
	}
}

// sigWindowsKubeProxy is the shape of sig-windows-tools' kube-proxy
// HostProcess DaemonSet for Calico (kubernetes-sigs/sig-windows-tools,
// hostprocess/calico/kube-proxy/kube-proxy.yml; its flannel variant was
// removed upstream in 2025), as far as an image swap depends on it, taken
// from its current manifest (the image's ${KUBERNETES_VERSION/+/_} filled
// in): the container gives only args, which the image's ENTRYPOINT
// ["PowerShell"] runs; the node name comes in NODENAME (which its start.ps1
// reads); there is no KUBE_NETWORK (its start.ps1 sets the network to
// "Calico" itself and takes the source VIP from Calico_ep); kubeadm's
// kube-proxy ConfigMap is mounted at /var/lib/kube-proxy.
const sigWindowsKubeProxy = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    k8s-app: kube-proxy
  name: kube-proxy-windows
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy-windows
  template:
    metadata:
      labels:
        k8s-app: kube-proxy-windows
    spec:
      serviceAccountName: kube-proxy
      securityContext:
        windowsOptions:
          hostProcess: true
          runAsUserName: "NT AUTHORITY\\system"
      hostNetwork: true
      priorityClassName: system-node-critical
      containers:
      - image: sigwindowstools/kube-proxy:v1.37.2-calico-hostprocess
        args: ["$env:CONTAINER_SANDBOX_MOUNT_POINT/kube-proxy/start.ps1"]
        workingDir: "$env:CONTAINER_SANDBOX_MOUNT_POINT/kube-proxy/"
        name: kube-proxy
        imagePullPolicy: Always
        env:
        - name: NODENAME
          valueFrom:
            fieldRef:
              apiVersion: v1
              fieldPath: spec.nodeName
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        volumeMounts:
        - mountPath: /var/lib/kube-proxy
          name: kube-proxy
      nodeSelector:
        kubernetes.io/os: windows
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      - operator: Exists
      volumes:
      - configMap:
          name: kube-proxy
        name: kube-proxy
  updateStrategy:
    type: RollingUpdate
`

// TestWindowsImageSwap: a kube-proxy HostProcess DaemonSet with only its
// image swapped for kproxy's runs kproxy: the script it names is in the
// image (the shim kube-proxy/start.ps1), the shim runs kproxy/start.ps1
// from the sandbox, passes only kproxy's flags, reads only environment
// variables the DaemonSet sets or that are optional, defaults the
// kubeconfig to where the DaemonSet mounts kubeadm's ConfigMap, and the
// command line it builds is one kproxy accepts in kernelspace mode.
func TestWindowsImageSwap(t *testing.T) {
	objs, err := decodeAll([]byte(sigWindowsKubeProxy))
	if err != nil || len(objs) != 1 {
		t.Fatalf("decoding the DaemonSet: %v (%d objects)", err, len(objs))
	}
	ds := objs[0].(*appsv1.DaemonSet)
	c := &ds.Spec.Template.Spec.Containers[0]
	const sandbox = "$env:CONTAINER_SANDBOX_MOUNT_POINT/"
	d := readDockerfile(t, "windows/Dockerfile")
	if len(c.Command) == 0 && !d.has(`^ENTRYPOINT \["(?i:powershell)(\.exe)?"\]$`) {
		t.Errorf("the DaemonSet gives no command, only args %q, and windows/Dockerfile has no ENTRYPOINT [\"PowerShell\"] to run them", c.Args)
	}
	script, ok := strings.CutPrefix(strings.Join(append(append([]string{}, c.Command...), c.Args...), " "), sandbox)
	if !ok {
		t.Fatalf("the DaemonSet runs %q, not a script under the sandbox mount point", c.Args)
	}
	if !d.has(`^COPY deploy/windows/kube-proxy-start\.ps1 /` + regexp.QuoteMeta(script) + `$`) {
		t.Errorf("windows/Dockerfile puts no shim at /%s, which kube-proxy DaemonSets run", script)
	}

	data, err := os.ReadFile("windows/kube-proxy-start.ps1")
	if err != nil {
		t.Fatal(err)
	}
	var code []string // the script without its comments
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			code = append(code, l)
		}
	}
	shim := strings.Join(code, "\n")
	if !strings.Contains(shim, "$env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/start.ps1'") || !strings.Contains(shim, "& $start @args") || !strings.Contains(shim, "& $start @kproxyArgs") {
		t.Errorf("the shim does not run kproxy/start.ps1 from the sandbox with its arguments, or with the ones it builds")
	}
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	flags := regexp.MustCompile(`["']--([a-z-]+)=`).FindAllStringSubmatch(shim, -1)
	if len(flags) < 3 {
		t.Fatalf("found %d flags in the shim, want at least --proxy-mode, --hostname-override, --kubeconfig", len(flags))
	}
	for _, m := range flags {
		if fs.Lookup(m[1]) == nil {
			t.Errorf("the shim passes --%s, which kproxy does not have", m[1])
		}
	}
	optional := map[string]bool{"CONTAINER_SANDBOX_MOUNT_POINT": true, "KUBEPROXY_KUBECONFIG": true, "KUBEPROXY_V": true}
	set := map[string]bool{}
	for _, e := range c.Env {
		set[e.Name] = true
	}
	// The node name: NODENAME (Calico's DaemonSet) or NODE_NAME (older
	// ones); the shim reads both, and the DaemonSet must set one.
	nodeVars := []string{"NODENAME", "NODE_NAME"}
	if !set[nodeVars[0]] && !set[nodeVars[1]] {
		t.Errorf("the DaemonSet sets neither of %v: the shim could not give --hostname-override", nodeVars)
	}
	for _, v := range nodeVars {
		optional[v] = true
		if !strings.Contains(shim, "$env:"+v) {
			t.Errorf("the shim does not read $env:%s for the node name", v)
		}
	}
	for _, m := range regexp.MustCompile(`\$env:([A-Z_]+)`).FindAllStringSubmatch(shim, -1) {
		if !optional[m[1]] && !set[m[1]] {
			t.Errorf("the shim reads $env:%s, which the DaemonSet does not set", m[1])
		}
	}
	const kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	if !strings.Contains(shim, "'"+kubeconfig+"'") {
		t.Errorf("the shim does not default the kubeconfig to %s", kubeconfig)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || m.MountPath+"/kubeconfig.conf" == kubeconfig
	}
	if !mounted {
		t.Errorf("the DaemonSet mounts nothing at %s's directory", kubeconfig)
	}

	// The command line the shim builds for this DaemonSet, as kproxy reads
	// it (--dry-run: kernelspace mode is valid off Windows only so).
	args := []string{"--proxy-mode=kernelspace", "--hostname-override=winnode1", "--kubeconfig=" + kubeconfig, "--dry-run"}
	o := config.NewOptions()
	fs = pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.ProxyMode() != config.ModeKernelspace || o.NodeName != "winnode1" || o.ClientConnection().Kubeconfig != kubeconfig {
		t.Errorf("mode %q node %q kubeconfig %q", o.ProxyMode(), o.NodeName, o.ClientConnection().Kubeconfig)
	}
	for _, want := range args[:2] {
		if !strings.Contains(shim, strings.SplitN(want, "=", 2)[0]+"=") {
			t.Errorf("the shim does not pass %s", want)
		}
	}
}
