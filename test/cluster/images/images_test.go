package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/hack/image"
	"github.com/kproxy/kproxy/hack/image/oci"
	"github.com/kproxy/kproxy/test/controlplane"
)

// layerFiles lists the entries of an archive's single layer: name → link
// target for symbolic links, or the content of regular files.
func layerFiles(t *testing.T, path string) (oci.Descriptor, oci.Config, map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	desc, cfg, layers, err := oci.ReadArchive(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(layers[0]))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			out[h.Name] = "-> " + h.Linkname
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		case tar.TypeDir:
			out[h.Name] = "dir"
		}
	}
	return desc, cfg, out
}

// TestBuildFilesOnly: an image of files alone (no packages) holds them, its
// links and directories, under the name and entrypoint of its spec; a second
// Build finds it cached, and a changed input file builds it again.
func TestBuildFilesOnly(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho one\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Name:       "prog",
		Refs:       []string{"registry.example/test/prog:1.2", "registry.example/test/prog:1.1"},
		Files:      []File{{Src: bin, Dst: "/prog", Mode: 0o755}, {Data: []byte("x\n"), Dst: "/etc/x.conf", Mode: 0o644}},
		Symlinks:   map[string]string{"/prog-2": "prog"},
		Dirs:       []image.Dir{{Name: "uploads", Mode: 0o755}},
		Entrypoint: []string{"/prog"},
		Cmd:        []string{"pause"},
	}
	o := Options{Dir: dir, Epoch: time.Unix(1700000000, 0)}
	built, err := Build(context.Background(), o, []Spec{spec})
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != 1 || built[0].Cached || built[0].Path != filepath.Join(dir, "prog.oci.tar") {
		t.Fatalf("Build = %+v, want one new archive prog.oci.tar", built)
	}
	desc, cfg, files := layerFiles(t, built[0].Path)
	if got := desc.Annotations["io.containerd.image.name"]; got != "registry.example/test/prog:1.2" {
		t.Errorf("image name %q, want the first ref", got)
	}
	if got := desc.Annotations[oci.AnnotationRefName]; got != "1.2" {
		t.Errorf("ref name %q, want the tag 1.2", got)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/prog"}) || !slices.Equal(cfg.Config.Cmd, []string{"pause"}) {
		t.Errorf("entrypoint %q cmd %q", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	for name, want := range map[string]string{
		"prog": "#!/bin/sh\necho one\n", "etc/x.conf": "x\n", "prog-2": "-> prog", "uploads/": "dir", "tmp/": "dir", "proc/": "dir",
	} {
		if files[name] != want {
			t.Errorf("layer entry %s = %q, want %q", name, files[name], want)
		}
	}

	again, err := Build(context.Background(), o, []Spec{spec})
	if err != nil || !again[0].Cached {
		t.Fatalf("second Build = %+v, %v; want it cached", again, err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho two\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	third, err := Build(context.Background(), o, []Spec{spec})
	if err != nil || third[0].Cached {
		t.Fatalf("Build after the binary changed = %+v, %v; want a new archive", third, err)
	}
	if _, _, files := layerFiles(t, third[0].Path); files["prog"] != "#!/bin/sh\necho two\n" {
		t.Errorf("rebuilt image holds %q, want the new binary", files["prog"])
	}
}

// TestSpecsNames: every image the e2e suite names is there once, under the
// exact reference of upstream's manifest, with its program when it has one.
func TestSpecsNames(t *testing.T) {
	specs := Specs(Programs{Pause: "/b/pause", Agnhost: "/b/agnhost", Regression: "/b/reg", CoreDNS: "/b/coredns", KubeProxy: "/b/kube-proxy", AgnhostSource: "/src/agnhost"})
	refs := map[string]bool{}
	for _, s := range specs {
		for _, r := range s.Refs {
			if refs[r] {
				t.Errorf("%s is named twice", r)
			}
			refs[r] = true
		}
		if s.Why == "" {
			t.Errorf("%s does not say how it differs from upstream's", s.Ref())
		}
		if _, _, err := splitRef(s.Ref()); err != nil {
			t.Error(err)
		}
	}
	for _, want := range []string{Pause, Agnhost, AgnhostPrev, BusyBox, Nginx, NginxNew, GlibcDNS, Regression, CoreDNS, KubeProxy,
		"registry.k8s.io/e2e-test-images/agnhost:2.66.1", "registry.k8s.io/pause:3.10.2"} {
		if !refs[want] {
			t.Errorf("no image is named %s", want)
		}
	}
	for _, s := range specs {
		if s.Name == "agnhost" {
			var dsts []string
			for _, f := range s.Files {
				dsts = append(dsts, f.Dst)
				if f.Dst == "/agnhost" && f.Src != "/b/agnhost" {
					t.Errorf("agnhost image takes %s, want the built agnhost", f.Src)
				}
				if f.Dst == "/coredns" && f.Src != "/b/coredns" {
					t.Errorf("agnhost image's /coredns is %s, want the built CoreDNS", f.Src)
				}
			}
			// /coredns: the DNS tests' own server pods run it from this image
			// ("should support configurable pod resolv.conf" failed without).
			if !slices.Contains(dsts, "/agnhost") || !slices.Contains(dsts, "/coredns") || !strings.HasPrefix(s.Entrypoint[0], "/agnhost") {
				t.Errorf("agnhost image: files %v, entrypoint %v", dsts, s.Entrypoint)
			}
		}
	}
}

func TestSplitRef(t *testing.T) {
	for ref, want := range map[string][2]string{
		"registry.k8s.io/pause:3.10.2":         {"registry.k8s.io/pause", "3.10.2"},
		"localhost:5000/a/b:v1":                {"localhost:5000/a/b", "v1"},
		"registry.k8s.io/coredns/coredns:v1.1": {"registry.k8s.io/coredns/coredns", "v1.1"},
	} {
		n, tag, err := splitRef(ref)
		if err != nil || n != want[0] || tag != want[1] {
			t.Errorf("splitRef(%q) = %q, %q, %v", ref, n, tag, err)
		}
	}
	for _, bad := range []string{"registry.k8s.io/pause", "localhost:5000/a"} {
		if _, _, err := splitRef(bad); err == nil {
			t.Errorf("splitRef(%q) accepted a reference without a tag", bad)
		}
	}
}

// TestAgnhostNetcat: nc in the agnhost image is netcat-openbsd's, as in
// upstream's: the e2e suite's reachability checks run
// sh -c "... | nc -v -t -w 2 ...", which busybox's nc refuses (-v), and
// every Service test failed with "service is not reachable" while the
// Services worked. /bin/nc must be netcat-openbsd's and /bin/sh must not
// be busybox (Debian's runs its own applets first: its nc again).
func TestAgnhostNetcat(t *testing.T) {
	for _, s := range Specs(Programs{Pause: "/b/pause", Agnhost: "/b/agnhost", Regression: "/b/reg", CoreDNS: "/b/coredns", KubeProxy: "/b/kube-proxy", AgnhostSource: "/src/agnhost"}) {
		if s.Name != "agnhost" {
			continue
		}
		if !slices.Contains(s.Packages, "netcat-openbsd") {
			t.Errorf("agnhost packages %v: no netcat-openbsd", s.Packages)
		}
		for _, l := range []string{"/bin/nc", "/bin/netcat"} {
			if got := s.Symlinks[l]; got != "nc.openbsd" {
				t.Errorf("agnhost image: %s -> %q, want nc.openbsd (or busybox's nc takes its place)", l, got)
			}
		}
		if got := s.Symlinks["/bin/sh"]; got != "dash" || !slices.Contains(s.Packages, "dash") {
			t.Errorf("agnhost image: /bin/sh -> %q (packages %v), want dash, not busybox", got, s.Packages)
		}
		// The suite's "should be able to up and down services" runs
		// wget -q -O - -T 1 in agnhost pods: busybox's wget segfaulted
		// there (exit 139, "Segmentation fault" for every request).
		if !slices.Contains(s.Packages, "wget") {
			t.Errorf("agnhost packages %v: no wget (busybox's segfaults)", s.Packages)
		}
		return
	}
	t.Fatal("no agnhost image")
}

// TestNetworkSuiteImages: every image the network tests of upstream's e2e
// suite name (imageutils.NAME in k8s.io/kubernetes v1.37.2's
// test/e2e/network, read from the module cache) is built here under the
// reference upstream's manifest gives it. A missing one is pulled by the
// kubelet, fails (the cluster has no registry), and its test fails on the
// harness: "should set TCP CLOSE_WAIT timeout" did, for distroless-iptables.
func TestNetworkSuiteImages(t *testing.T) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "k8s.io", "kubernetes@"+controlplane.KubernetesVersion)
	manifest, err := os.ReadFile(filepath.Join(src, "test", "utils", "image", "manifest.go"))
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("k8s.io/kubernetes %s is not in the module cache (make conformance-binaries fetches it): %v", controlplane.KubernetesVersion, err)
	}
	registries := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(\w+Registry):\s*"([^"]+)",`).FindAllStringSubmatch(string(manifest), -1) {
		registries[m[1]] = m[2]
	}
	refs := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*configs\[(\w+)\] = Config\{list\.(\w+), "([^"]+)", "([^"]+)"\}`).FindAllStringSubmatch(string(manifest), -1) {
		reg, ok := registries[m[2]]
		if !ok {
			t.Fatalf("manifest.go: no default for %s", m[2])
		}
		refs[m[1]] = reg + "/" + m[3] + ":" + m[4]
	}
	if len(refs) < 10 {
		t.Fatalf("read %d image configs from manifest.go: its format changed", len(refs))
	}
	used := map[string]bool{}
	use := regexp.MustCompile(`imageutils\.(\w+)\b`)
	err = filepath.WalkDir(filepath.Join(src, "test", "e2e", "network"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range use.FindAllStringSubmatch(string(data), -1) {
			if _, ok := refs[m[1]]; ok {
				used[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]bool{}
	for _, s := range Specs(Programs{Pause: "/b/pause", Agnhost: "/b/agnhost", Regression: "/b/reg", CoreDNS: "/b/coredns", KubeProxy: "/b/kube-proxy", AgnhostSource: "/src/agnhost"}) {
		for _, r := range s.Refs {
			built[r] = true
		}
	}
	if len(used) < 5 {
		t.Fatalf("found %d images used by test/e2e/network: the scan is broken", len(used))
	}
	for name := range used {
		if !built[refs[name]] {
			t.Errorf("the network tests use imageutils.%s (%s): no image of make cluster is named so", name, refs[name])
		}
	}
}
