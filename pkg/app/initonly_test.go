package app

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/kproxy/kproxy/pkg/config"
)

// TestInitOnlyRunsOnlyInit: with --init-only, RunWith runs the mode's Init
// and returns its result, without a source, a backend or a server; a mode
// without Init has nothing to do.
func TestInitOnlyRunsOnlyInit(t *testing.T) {
	o := options(t, "--manifests", t.TempDir(), "--hostname-override", "node1", "--init-only")
	errInit := errors.New("sysctl refused")
	var inits int
	mode := Mode{
		Init: func(_ context.Context, got *config.Options) error {
			inits++
			if got != o {
				t.Error("Init got other options")
			}
			return errInit
		},
		NewBackend: func(context.Context, *config.Options, Env) (Backends, error) {
			t.Error("--init-only started a backend")
			return nil, errors.New("no")
		},
	}
	d := Deps{Modes: Modes{"iptables": mode}, Listen: func(network, address string) (net.Listener, error) {
		t.Errorf("--init-only listened on %s", address)
		return nil, errors.New("no")
	}}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := RunWith(ctx, o, d); !errors.Is(err, errInit) || inits != 1 {
		t.Errorf("RunWith = %v after %d Init calls, want Init's error after 1", err, inits)
	}
	mode.Init = nil
	d.Modes["iptables"] = mode
	if err := RunWith(ctx, o, d); err != nil {
		t.Errorf("without Init: %v", err)
	}
}
