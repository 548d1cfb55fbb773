package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kproxy/kproxy/pkg/config"
)

// noChangeWait is how long the tests watch for a change that must not be
// reported (the watch interval is 1 ms).
const noChangeWait = 50 * time.Millisecond

// writeFile replaces path's content atomically (a rename), as editors and
// the kubelet do.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func expectChange(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if !errors.Is(err, ErrConfigChanged) {
			t.Errorf("%s: got %v, want ErrConfigChanged", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not reported within 10 s", what)
	}
}

func expectNoChange(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s reported as a change: %v", what, err)
	case <-time.After(noChangeWait):
	}
}

// TestWatchConfigFile: the same bytes rewritten are no change; different
// bytes are reported once as ErrConfigChanged.
func TestWatchConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, path, "mode: iptables\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := watchConfigFile(ctx, path, nil, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, "mode: iptables\n")
	expectNoChange(t, ch, "the same content")
	writeFile(t, path, "mode: nftables\n")
	expectChange(t, ch, "new content")
}

// TestChangeDetector: new content counts once two reads in a row return
// it, so that a read in the middle of an in-place rewrite (truncated, then
// written) is no change; failed reads (a ConfigMap's ..data being swapped)
// change nothing.
func TestChangeDetector(t *testing.T) {
	errRead := errors.New("no such file")
	type read struct {
		content string
		err     error
		want    bool
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"same content", []read{{"a", nil, false}, {"a", nil, false}}},
		{"in-place rewrites with the same bytes", []read{{"", nil, false}, {"a", nil, false}, {"", nil, false}, {"a", nil, false}, {"a", nil, false}}},
		{"new content, read twice", []read{{"b", nil, false}, {"b", nil, true}}},
		{"new content written in place", []read{{"", nil, false}, {"b", nil, false}, {"b", nil, true}}},
		{"an emptied file", []read{{"", nil, false}, {"", nil, true}}},
		{"failed reads in between", []read{{"", errRead, false}, {"b", nil, false}, {"", errRead, false}, {"b", nil, true}}},
		{"back to the initial content", []read{{"b", nil, false}, {"a", nil, false}, {"b", nil, false}, {"c", nil, false}, {"c", nil, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := changeDetector{initial: []byte("a")}
			for i, r := range tc.reads {
				if got := d.changed([]byte(r.content), r.err); got != r.want {
					t.Fatalf("read %d (%q, %v): changed %v, want %v", i, r.content, r.err, got, r.want)
				}
			}
		})
	}
}

// TestWatchConfigFileComparesWithLoadedBytes: the file is compared with the
// bytes the configuration was loaded from, so that an edit made between the
// load and the start of the watch (kproxy starting: initial lists, waiting
// for its Node) is a change.
func TestWatchConfigFileComparesWithLoadedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, path, "mode: nftables\n") // edited after the load
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := watchConfigFile(ctx, path, []byte("mode: iptables\n"), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	expectChange(t, ch, "an edit made before the watch started")
}

// configMapVolume lays out a directory as the kubelet does for a ConfigMap
// volume (its atomic writer): the key config.conf is a symbolic link to
// ..data/config.conf, ..data a link to a timestamped directory. update
// writes a new timestamped directory and swaps ..data to it with a rename,
// then removes the old directory.
type configMapVolume struct {
	t   *testing.T
	dir string
	gen int
	cur string
}

func newConfigMapVolume(t *testing.T, content string) *configMapVolume {
	v := &configMapVolume{t: t, dir: t.TempDir()}
	v.update(content)
	if err := os.Symlink(filepath.Join("..data", "config.conf"), filepath.Join(v.dir, "config.conf")); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *configMapVolume) path() string { return filepath.Join(v.dir, "config.conf") }

func (v *configMapVolume) update(content string) {
	v.t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", v.gen, v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	writeFile(v.t, filepath.Join(v.dir, ts, "config.conf"), content)
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	if v.cur != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, v.cur)); err != nil {
			v.t.Fatal(err)
		}
	}
	v.cur = ts
}

// TestWatchConfigFileConfigMapSwap: an edited ConfigMap reaches the file
// through a swap of the ..data symbolic link: a swap to the same content is
// no change, a swap to other content is; a moment without ..data (a read
// failing) is not a change by itself.
func TestWatchConfigFileConfigMapSwap(t *testing.T) {
	v := newConfigMapVolume(t, "mode: iptables\n")
	data, err := os.ReadFile(v.path())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := watchConfigFile(ctx, v.path(), data, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	v.update("mode: iptables\n")
	expectNoChange(t, ch, "a swap to the same content")
	if err := os.Remove(filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	expectNoChange(t, ch, "a missing ..data")
	v.update("mode: iptables\nclusterCIDR: 10.244.0.0/16\n")
	expectChange(t, ch, "a swap to new content")
}

// harnessConfig is the configuration the harness's flags give (they are
// ignored with --config).
const harnessConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: node1
iptables:
  minSyncPeriod: 10ms
  syncPeriod: 1s
`

// TestRunExitsWhenConfigFileChanges: kproxy running with --config (a
// ConfigMap volume) returns ErrConfigChanged from RunWith once the
// ConfigMap's content changes, so that the process exits and its DaemonSet
// restarts it; before that, a swap to the same content does nothing.
func TestRunExitsWhenConfigFileChanges(t *testing.T) {
	v := newConfigMapVolume(t, harnessConfig)
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(freePort(t), "node1")})
	h := start(t, dir, run{args: []string{"--config", v.path()},
		tweak: func(_ *config.Options, d *Deps) { d.ConfigWatchInterval = time.Millisecond }})
	h.expectErr = true
	h.waitSync("first sync", succeeded)
	v.update(harnessConfig)
	select {
	case <-h.done:
		t.Fatalf("RunWith returned after a swap to the same content: %v", h.runErr)
	case <-time.After(noChangeWait):
	}
	v.update(harnessConfig + "clusterCIDR: 10.244.0.0/16\n")
	select {
	case <-h.done:
		if !errors.Is(h.runErr, ErrConfigChanged) {
			t.Errorf("RunWith returned %v, want ErrConfigChanged", h.runErr)
		}
	case <-time.After(testTimeout):
		t.Fatal("RunWith did not return after the config file changed")
	}
}

// TestRunExitsWhenConfigChangedDuringStart: an edit between loading the
// configuration and the end of kproxy's start is not missed.
func TestRunExitsWhenConfigChangedDuringStart(t *testing.T) {
	v := newConfigMapVolume(t, harnessConfig)
	dir := manifests(t, map[string]string{"node.yaml": fmt.Sprintf(nodeYAML, ""), "web.yaml": lbYAML(freePort(t), "node1")})
	h := start(t, dir, run{args: []string{"--config", v.path()},
		tweak: func(o *config.Options, d *Deps) {
			if string(o.ConfigData) != harnessConfig {
				t.Errorf("ConfigData %q, want the file's bytes", o.ConfigData)
			}
			d.ConfigWatchInterval = time.Millisecond
			v.update(harnessConfig + "clusterCIDR: 10.244.0.0/16\n") // after Complete, before RunWith
		}})
	h.expectErr = true
	select {
	case <-h.done:
		if !errors.Is(h.runErr, ErrConfigChanged) {
			t.Errorf("RunWith returned %v, want ErrConfigChanged", h.runErr)
		}
	case <-time.After(testTimeout):
		t.Fatal("RunWith did not return: the edit made during start was missed")
	}
}
