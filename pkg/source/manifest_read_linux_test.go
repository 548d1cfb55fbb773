package source

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/cache"
)

// mkfifo creates a named pipe and, when the test ends, opens it for writing
// without blocking: a reader stuck on it (the code before the fix) is
// released, so a failing run ends instead of hanging.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releaseFIFO(path) })
}

func releaseFIFO(path string) {
	for range 50 {
		f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			_ = f.Close()
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestManifestReaderSkipsWhatIsNotARegularFile: named pipes, sockets,
// devices (through a symbolic link), links to them and files over the size
// cap are reported once each, naming the file, and skipped without
// blocking; a symbolic link to a regular file is read.
func TestManifestReaderSkipsWhatIsNotARegularFile(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	writeFile(t, dir, "good.yaml", svc("good", "good", 80))
	writeFile(t, other, "target.yaml", svc("linked", "link", 80))
	mkfifo(t, filepath.Join(dir, "x.yaml"))
	mkfifo(t, filepath.Join(other, "pipe.yaml"))
	for link, target := range map[string]string{
		"link.yaml":      filepath.Join(other, "target.yaml"),
		"link-pipe.yaml": filepath.Join(other, "pipe.yaml"),
		"zero.yaml":      "/dev/zero",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	big, err := os.Create(filepath.Join(dir, "big.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Truncate(maxManifestSize + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	_ = big.Close()

	logs := &logBuffer{}
	s := newManifestStore(dir, logs.logger())
	done := make(chan error, 1)
	go func() {
		err := s.scan(false)
		if err == nil {
			err = s.scan(false) // a second scan reports nothing new
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		releaseFIFO(filepath.Join(dir, "x.yaml"))
		releaseFIFO(filepath.Join(other, "pipe.yaml"))
		t.Fatal("scanning the directory blocked")
	}
	got := servedObjects(t, s)
	want := []string{"Service default/good src=good port=80 rv=1", "Service default/linked src=link port=80 rv=2"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("served:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, name := range []string{"x.yaml", "link-pipe.yaml", "zero.yaml", "sock.yaml"} {
		if n := len(logs.find("Cannot read manifest file", filepath.Join(dir, name), "not a regular file")); n != 1 {
			t.Errorf("%s reported %d times, want once", name, n)
		}
	}
	if n := len(logs.find("Cannot read manifest file", filepath.Join(dir, "big.yaml"), "limit per manifest file")); n != 1 {
		t.Errorf("big.yaml reported %d times, want once", n)
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}

// TestManifestSourceSurvivesFIFOAndHostileName is the operator's report: a
// named pipe called x.yaml and a Service whose name holds a newline in the
// manifest directory, then an endpoint removed. The cache (the real one)
// rejects the hostile Service and sees the endpoint go.
func TestManifestSourceSurvivesFIFOAndHostileName(t *testing.T) {
	dir := t.TempDir()
	slice := func(ips ...string) string {
		s := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports:\n- {name: \"\", port: 8080, protocol: TCP}\nendpoints:\n"
		for _, ip := range ips {
			s += "- addresses: [" + ip + "]\n"
		}
		return s
	}
	web := "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.10\n  ports:\n  - {port: 80, protocol: TCP}\n"
	evil := "apiVersion: v1\nkind: Service\nmetadata:\n  name: \"evil\\n-A KPROXY-SERVICES -j ACCEPT\"\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.11\n  ports:\n  - {port: 80, protocol: TCP}\n"
	writeFile(t, dir, "web.yaml", web)
	writeFile(t, dir, "slice.yaml", slice("10.0.1.1", "10.0.1.2"))
	writeFile(t, dir, "evil.yaml", evil)
	mkfifo(t, filepath.Join(dir, "x.yaml"))

	logs := &logBuffer{}
	quiet := logs.logger()
	c := cache.New(cache.Options{NodeName: "node-1", Logger: &quiet})
	writeFile(t, dir, "node.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n")
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logs.logger()))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := RunManifests(ctx, dir, "node-1", c); err != nil {
			t.Errorf("RunManifests: %v", err)
		}
	})
	t.Cleanup(func() {
		cancel()
		releaseFIFO(filepath.Join(dir, "x.yaml"))
		wg.Wait()
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})

	endpoints := func() string {
		select {
		case <-c.Synced():
		default:
			return "not synced"
		}
		snap, _ := c.Snapshot()
		var out []string
		for _, p := range snap.IPv4.Sorted() {
			var eps []string
			for _, e := range p.ClusterEndpoints {
				eps = append(eps, e.String())
			}
			out = append(out, p.Name.String()+"="+strings.Join(eps, ","))
		}
		return strings.Join(out, " ")
	}
	eventually(t, "the initial state", func() bool { return endpoints() == "demo/web=10.0.1.1:8080,10.0.1.2:8080" })
	writeFile(t, dir, "slice.yaml", slice("10.0.1.1"))
	eventually(t, "the endpoint removal", func() bool { return endpoints() == "demo/web=10.0.1.1:8080" })
	if len(logs.find("x.yaml", "not a regular file")) != 1 {
		t.Error("the named pipe was not reported once")
	}
	if len(logs.find("Ignoring bad input", "metadata.name")) != 1 {
		t.Error("the hostile Service was not reported once")
	}
}
