package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"

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
