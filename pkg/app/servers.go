package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// serverRetryInterval is how long a server that cannot listen (or stopped)
// waits before trying again, as upstream kube-proxy does.
const serverRetryInterval = 5 * time.Second

// listenFunc opens a listening socket (net.Listen).
type listenFunc func(network, address string) (net.Listener, error)

// servers runs kproxy's HTTP servers (metrics, healthz) until their
// context is done.
type servers struct {
	log      klog.Logger
	listen   listenFunc
	onListen func(server string, addr net.Addr)
	hardFail bool
	// fatal receives the first error of a server that cannot listen, with
	// hardFail (--bind-address-hard-fail).
	fatal chan error
	wg    sync.WaitGroup
}

func newServers(log klog.Logger, listen listenFunc, onListen func(string, net.Addr), hardFail bool) *servers {
	return &servers{log: log, listen: listen, onListen: onListen, hardFail: hardFail, fatal: make(chan error, 1)}
}

// start serves h on addr in the background. Without hardFail, a socket that
// cannot be opened is logged and retried every serverRetryInterval; a server
// that stops is restarted the same way.
func (s *servers) start(ctx context.Context, what, addr string, h http.Handler) {
	s.wg.Go(func() {
		for ctx.Err() == nil {
			err := s.serve(ctx, what, addr, h)
			if ctx.Err() != nil {
				return
			}
			if s.hardFail {
				select {
				case s.fatal <- fmt.Errorf("%s server on %s: %w", what, addr, err):
				default:
				}
				return
			}
			s.log.Error(err, "Server failed; retrying", "server", what, "address", addr, "retryIn", serverRetryInterval)
			t := time.NewTimer(serverRetryInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	})
}

// serve listens and serves until ctx is done (nil) or the server fails.
func (s *servers) serve(ctx context.Context, what, addr string, h http.Handler) error {
	l, err := s.listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	s.log.Info("Serving", "server", what, "address", l.Addr().String())
	if s.onListen != nil {
		s.onListen(what, l.Addr())
	}
	err = srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) && ctx.Err() != nil {
		return nil
	}
	return err
}

// wait returns once every server has stopped (after their context is done).
func (s *servers) wait() { s.wg.Wait() }
