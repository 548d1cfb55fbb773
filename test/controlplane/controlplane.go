package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
)

// ErrStopped is returned by methods of a ControlPlane after Stop.
var ErrStopped = errors.New("control plane is stopped")

// ControlPlane is a running etcd and kube-apiserver. The exported fields stay
// the same for its whole life, across StopAPIServer/StartAPIServer and Reset,
// so a client configured once keeps working after each of them.
type ControlPlane struct {
	// URL is kube-apiserver's address, https://<ListenIP>:<SecurePort>.
	URL string
	// CAPEM is the CA certificate that signed the serving certificate.
	CAPEM []byte
	// AdminToken and KproxyToken are the bearer tokens of Admin and Kproxy.
	AdminToken  string
	KproxyToken string
	// UserTokens are the tokens of Options.Users, by name.
	UserTokens map[string]string
	// Dir holds certificates, tokens, etcd data, the audit log and the
	// servers' logs (etcd.log, kube-apiserver.log).
	Dir string
	// CAFile, SAKeyFile and SAPubFile are the CA certificate (the kubelets'
	// clientCAFile: it signed kube-apiserver's client certificate) and the
	// service-account signing key pair, in Dir (kube-controller-manager
	// takes them).
	CAFile, SAKeyFile, SAPubFile string

	opts    Options
	files   layout
	ownsDir bool

	mu        sync.Mutex // serializes lifecycle methods and guards the fields below
	etcd      *process
	apiserver *process
	stopped   bool
}

// Start writes fresh certificates, keys and tokens (removing etcd data and an
// audit log left in Dir by an earlier run), starts etcd, then kube-apiserver,
// and returns once /readyz answers 200. On error nothing is left running. ctx
// bounds the start only; the servers run until Stop.
func Start(ctx context.Context, o Options) (*ControlPlane, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("control plane options: %w", err)
	}
	svcIP, _ := firstServiceIP(o.ServiceClusterIPRange) // validated by withDefaults

	cp := &ControlPlane{URL: o.apiURL(), opts: o, Dir: o.Dir}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "kproxy-controlplane-"); err != nil {
			return nil, fmt.Errorf("creating control-plane directory: %w", err)
		}
		cp.ownsDir = true
	} else if err := os.MkdirAll(cp.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating control-plane directory: %w", err)
	}
	cp.files = layout{dir: cp.Dir}
	cp.CAFile, cp.SAKeyFile, cp.SAPubFile = cp.files.caCert(), cp.files.saKey(), cp.files.saPub()

	// Start always makes a new cluster: no data or audit events from an
	// earlier run in the same Dir.
	for _, stale := range []string{cp.files.etcdData(), cp.files.auditLog()} {
		if err := os.RemoveAll(stale); err != nil {
			return nil, errors.Join(fmt.Errorf("clearing %s: %w", stale, err), cp.Stop())
		}
	}
	if err := cp.writeFiles(svcIP); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	cp.mu.Lock()
	err = cp.startLocked(ctx)
	cp.mu.Unlock()
	if err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	return cp, nil
}

// writeFiles creates the key material, token file and audit policy.
func (cp *ControlPlane) writeFiles(svcIP netip.Addr) error {
	p, err := newPKI(cp.opts.ListenIP, svcIP, time.Now())
	if err != nil {
		return fmt.Errorf("control-plane certificates: %w", err)
	}
	if cp.AdminToken, err = randomToken(); err != nil {
		return err
	}
	if cp.KproxyToken, err = randomToken(); err != nil {
		return err
	}
	cp.CAPEM = p.caCert
	cp.UserTokens = map[string]string{}
	var userTokens []string
	for _, u := range cp.opts.Users {
		tok, err := randomToken()
		if err != nil {
			return err
		}
		cp.UserTokens[u.Name] = tok
		userTokens = append(userTokens, tok)
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{cp.files.caCert(), p.caCert, 0o644},
		{cp.files.servingCert(), p.servingCert, 0o644},
		{cp.files.servingKey(), p.servingKey, 0o600},
		{cp.files.saKey(), p.saKey, 0o600},
		{cp.files.saPub(), p.saPub, 0o644},
		{cp.files.kubeletClientCert(), p.kubeletClientCert, 0o644},
		{cp.files.kubeletClientKey(), p.kubeletClientKey, 0o600},
		{cp.files.tokens(), tokenFile(cp.AdminToken, cp.KproxyToken, cp.opts.Users, userTokens), 0o600},
		{cp.files.auditPolicy(), []byte(auditPolicy), 0o644},
	} {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return fmt.Errorf("writing control-plane file: %w", err)
		}
	}
	return nil
}

func randomToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// startLocked starts whichever server is not running, etcd first.
func (cp *ControlPlane) startLocked(ctx context.Context) error {
	if cp.stopped {
		return ErrStopped
	}
	// A server that died on its own is started again.
	for _, p := range []**process{&cp.etcd, &cp.apiserver} {
		if *p != nil {
			if done, _ := (*p).exited(); done {
				*p = nil
			}
		}
	}
	if cp.etcd == nil {
		p, err := cp.run(ctx, "etcd", cp.opts.Binaries.Etcd, etcdArgs(cp.opts, cp.files), cp.etcdHealthy)
		if err != nil {
			return err
		}
		cp.etcd = p
	}
	if cp.apiserver == nil {
		p, err := cp.run(ctx, "kube-apiserver", cp.opts.Binaries.KubeAPIServer, apiserverArgs(cp.opts, cp.files), cp.apiserverReady)
		if err != nil {
			return err
		}
		cp.apiserver = p
	}
	return nil
}

// run starts one server and waits until probe succeeds. If the server exits
// or does not become ready within ReadyTimeout, it is stopped and the error
// carries the end of its log.
func (cp *ControlPlane) run(ctx context.Context, name, binary string, args []string, probe func(context.Context) error) (*process, error) {
	argv := append(append(append([]string{}, cp.opts.CommandPrefix...), binary), args...)
	p, err := startProcess(name, argv, cp.files.log(name), cp.opts.Output)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cp.opts.ReadyTimeout)
	defer cancel()
	var last error
	for {
		if last = probe(ctx); last == nil {
			if done, _ := p.exited(); !done {
				return p, nil
			}
			// Something else answered on our address while this server died;
			// the next select reports the exit.
		}
		timer := time.NewTimer(200 * time.Millisecond)
		select {
		case <-p.done:
			timer.Stop()
			return nil, fmt.Errorf("%s exited before it was ready (%v); last probe: %w\n%s",
				name, p.err, last, logTail(cp.files.log(name), 3000))
		case <-ctx.Done():
			timer.Stop()
			stopErr := p.stop(cp.opts.StopTimeout)
			return nil, errors.Join(fmt.Errorf("%s not ready: %w; last probe: %w\n%s",
				name, ctx.Err(), last, logTail(cp.files.log(name), 3000)), stopErr)
		case <-timer.C:
		}
	}
}

// httpClient is a one-shot client that dials through Options.Dial.
func (cp *ControlPlane) httpClient(tlsConfig *tls.Config) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:       cp.opts.Dial,
			TLSClientConfig:   tlsConfig,
			DisableKeepAlives: true,
			Proxy:             nil, // never through a proxy from the environment
		},
	}
}

// EtcdURL is etcd's client address (on loopback in the control plane's
// namespace: reach it through EtcdClient).
func (cp *ControlPlane) EtcdURL() string { return cp.opts.etcdClientURL() }

// EtcdClient is an HTTP client that reaches etcd (Options.Dial), for its
// JSON gateway (/v3/kv/...): the benchmarks load large clusters straight
// into storage with it.
func (cp *ControlPlane) EtcdClient() *http.Client {
	return &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{
			DialContext:         cp.opts.Dial,
			MaxIdleConnsPerHost: 32,
			Proxy:               nil,
		},
	}
}

func (cp *ControlPlane) etcdHealthy(ctx context.Context) error {
	return probe(ctx, cp.httpClient(nil), cp.opts.etcdClientURL()+"/health", "", `"health":"true"`)
}

func (cp *ControlPlane) apiserverReady(ctx context.Context) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.CAPEM)
	c := cp.httpClient(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	return probe(ctx, c, cp.URL+"/readyz", cp.AdminToken, "")
}

// probe GETs url and succeeds on 200 with a body containing want.
func probe(ctx context.Context, c *http.Client, url, token, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("probe %s: status %d: %.300s", url, resp.StatusCode, body)
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after
// StopTimeout), leaving etcd and its data as they are. Stopping a stopped
// API server is a no-op.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.apiserver == nil {
		return nil
	}
	err := cp.apiserver.stop(cp.opts.StopTimeout)
	cp.apiserver = nil
	if err != nil {
		return fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer (or after it
// exited on its own), on the same address with the same certificates and
// tokens, and waits for /readyz. etcd is started too if it is not running.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.apiserver != nil {
		if done, _ := cp.apiserver.exited(); !done {
			return errors.New("kube-apiserver is already running")
		}
	}
	return cp.startLocked(ctx)
}

// Reset makes a new cluster behind the same address: it stops both servers,
// deletes etcd's data, and starts both again. Certificates, tokens and the
// audit log are kept, so clients reconnect without new configuration and
// find none of the old objects.
func (cp *ControlPlane) Reset(ctx context.Context) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return ErrStopped
	}
	if err := cp.stopServersLocked(); err != nil {
		return err
	}
	if err := os.RemoveAll(cp.files.etcdData()); err != nil {
		return fmt.Errorf("wiping etcd data: %w", err)
	}
	return cp.startLocked(ctx)
}

// stopServersLocked stops kube-apiserver, then etcd.
func (cp *ControlPlane) stopServersLocked() error {
	var errs []error
	if cp.apiserver != nil {
		if err := cp.apiserver.stop(cp.opts.StopTimeout); err != nil {
			errs = append(errs, fmt.Errorf("stopping kube-apiserver: %w", err))
		}
		cp.apiserver = nil
	}
	if cp.etcd != nil {
		if err := cp.etcd.stop(cp.opts.StopTimeout); err != nil {
			errs = append(errs, fmt.Errorf("stopping etcd: %w", err))
		}
		cp.etcd = nil
	}
	return errors.Join(errs...)
}

// Stop stops both servers and removes Dir if Start created it. It is safe to
// call more than once; every other method fails with ErrStopped afterwards.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.stopped {
		return nil
	}
	cp.stopped = true
	err := cp.stopServersLocked()
	if cp.ownsDir {
		if rmErr := os.RemoveAll(cp.Dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("removing control-plane directory: %w", rmErr))
		}
	}
	return err
}
