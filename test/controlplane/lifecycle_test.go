package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pipeNet is an in-memory network: Dial hands one end of a net.Pipe to
// Accept. No socket is opened, so lifecycle tests need neither root nor a
// port.
type pipeNet struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newPipeNet() *pipeNet {
	return &pipeNet{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (p *pipeNet) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

func (p *pipeNet) Close() error {
	p.closeOnce.Do(func() { close(p.done) })
	return nil
}

func (p *pipeNet) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

func (p *pipeNet) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case p.conns <- server:
		return client, nil
	case <-p.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fakeServers answers the readiness probes in memory: etcd's /health in
// plain HTTP, kube-apiserver's /readyz over TLS with the serving certificate
// Start wrote into dir, and only for the admin token.
type fakeServers struct {
	etcd, api *pipeNet
	etcdPort  string
}

func startFakeServers(t *testing.T, dir string, etcdPort int) *fakeServers {
	t.Helper()
	f := &fakeServers{etcd: newPipeNet(), api: newPipeNet(), etcdPort: strconv.Itoa(etcdPort)}
	etcdSrv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			_, _ = w.Write([]byte(`{"health":"true","reason":""}`))
			return
		}
		http.NotFound(w, r)
	})}
	apiSrv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens, _ := os.ReadFile(filepath.Join(dir, "tokens.csv"))
		admin, _, _ := strings.Cut(string(tokens), ",")
		if r.URL.Path != "/readyz" || r.Header.Get("Authorization") != "Bearer "+admin {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"))
		return &c, err
	}}
	go func() { _ = etcdSrv.Serve(f.etcd) }()
	go func() { _ = apiSrv.Serve(tls.NewListener(f.api, tlsCfg)) }()
	t.Cleanup(func() {
		_ = etcdSrv.Close()
		_ = apiSrv.Close()
	})
	return f
}

func (f *fakeServers) Dial(ctx context.Context, _, addr string) (net.Conn, error) {
	_, port, _ := net.SplitHostPort(addr)
	if port == f.etcdPort {
		return f.etcd.dial(ctx)
	}
	return f.api.dial(ctx)
}

// TestLifecycle drives Start, StopAPIServer, StartAPIServer, Reset and Stop
// with stand-in server processes (the test binary, waiting for SIGTERM) and
// in-memory readiness endpoints.
func TestLifecycle(t *testing.T) {
	t.Setenv(envFake, "sleep")
	dir := filepath.Join(t.TempDir(), "cp")
	srv := startFakeServers(t, dir, 2379)
	// Leftovers of an earlier run in the same Dir must not leak into the new cluster.
	staleData, staleAudit := filepath.Join(dir, "etcd-data", "member"), filepath.Join(dir, "audit.log")
	if err := os.MkdirAll(staleData, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(staleAudit, []byte(auditDenied+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cp, err := Start(context.Background(), Options{
		Binaries:              Binaries{Etcd: os.Args[0], KubeAPIServer: os.Args[0]},
		AllowCurrentNamespace: true, // the stand-ins listen nowhere
		Dial:                  srv.Dial,
		Dir:                   dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })

	if fileExists(staleData) || fileExists(staleAudit) {
		t.Error("Start kept etcd data or an audit log from an earlier run")
	}
	if d, err := cp.AuditDenials(); len(d) != 0 || err != nil {
		t.Errorf("AuditDenials on a new cluster = %v, %v; want none", d, err)
	}
	for _, f := range []string{"ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub", "tokens.csv", "audit-policy.yaml"} {
		if !fileExists(filepath.Join(dir, f)) {
			t.Errorf("Start did not write %s", f)
		}
	}
	if cp.URL != "https://127.0.0.1:6443" || cp.AdminToken == "" || cp.KproxyToken == "" || cp.AdminToken == cp.KproxyToken {
		t.Errorf("ControlPlane = URL %q admin %q kproxy %q", cp.URL, cp.AdminToken, cp.KproxyToken)
	}
	running := func() (etcd, api *process) {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		return cp.etcd, cp.apiserver
	}
	etcd1, api1 := running()
	if etcd1 == nil || api1 == nil {
		t.Fatal("Start returned without both servers running")
	}

	// Outage: only kube-apiserver stops; starting it again makes a new process.
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if done, _ := api1.exited(); !done {
		t.Error("kube-apiserver still runs after StopAPIServer")
	}
	if done, _ := etcd1.exited(); done {
		t.Error("etcd stopped with the API server")
	}
	if err := cp.StopAPIServer(); err != nil {
		t.Errorf("second StopAPIServer: %v", err)
	}
	if err := cp.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(context.Background()); err == nil {
		t.Error("StartAPIServer on a running API server succeeded")
	}
	_, api2 := running()
	if api2 == nil || api2 == api1 {
		t.Fatal("StartAPIServer did not start a new process")
	}

	// A server that dies on its own is started again by StartAPIServer.
	if err := api2.stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(context.Background()); err != nil {
		t.Fatalf("StartAPIServer after the server died: %v", err)
	}

	// Reset: both servers restart, etcd's data is gone, credentials stay.
	marker := filepath.Join(dir, "etcd-data", "member")
	if err := os.MkdirAll(marker, 0o755); err != nil {
		t.Fatal(err)
	}
	url, ca, admin := cp.URL, string(cp.CAPEM), cp.AdminToken
	if err := cp.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fileExists(marker) {
		t.Error("Reset kept etcd's data")
	}
	if cp.URL != url || string(cp.CAPEM) != ca || cp.AdminToken != admin {
		t.Error("Reset changed the address or credentials")
	}
	etcd3, api3 := running()
	if done, _ := etcd1.exited(); !done || etcd3 == nil || etcd3 == etcd1 || api3 == nil {
		t.Error("Reset did not restart etcd and kube-apiserver")
	}

	// Stop ends everything, keeps a caller's Dir, and is final.
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*process{etcd3, api3} {
		if done, _ := p.exited(); !done {
			t.Errorf("%s still runs after Stop", p.name)
		}
	}
	if !fileExists(filepath.Join(dir, "etcd.log")) {
		t.Error("Stop removed a directory it did not create")
	}
	if err := cp.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := cp.StartAPIServer(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("StartAPIServer after Stop = %v, want ErrStopped", err)
	}
	if err := cp.Reset(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Reset after Stop = %v, want ErrStopped", err)
	}
}
