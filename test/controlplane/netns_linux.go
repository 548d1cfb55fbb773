package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NetnsDialer returns a DialFunc whose sockets are created inside a network
// namespace: ns is a name made by "ip netns add" (/run/netns/<ns>) or a path
// such as /proc/<pid>/ns/net.
//
// Each dial runs on a fresh goroutine locked to its OS thread: the thread
// enters the namespace, creates and connects the socket, and returns to its
// original namespace before it is unlocked. A socket belongs to the namespace
// it was created in for its whole life, so the returned connection can be used
// from any goroutine. If the thread cannot return, it stays locked and the Go
// runtime discards it when the goroutine ends, so no other goroutine ever runs
// in the wrong namespace.
//
// The address must be an IP literal: resolving a name could start helper
// goroutines outside the locked thread.
func NetnsDialer(ns string) DialFunc {
	path := ns
	if !strings.ContainsRune(ns, '/') {
		path = filepath.Join("/run/netns", ns)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("dialing %s in netns %s: %w", addr, path, err)
		}
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("dialing %s in netns %s: host must be an IP address", addr, path)
		}
		type result struct {
			conn net.Conn
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			conn, restored, err := dialInNetns(ctx, path, network, addr)
			if restored {
				runtime.UnlockOSThread()
			}
			ch <- result{conn, err}
		}()
		r := <-ch
		return r.conn, r.err
	}
}

// dialInNetns must run on a locked thread. restored reports whether the
// thread is back in its original namespace.
func dialInNetns(ctx context.Context, path, network, addr string) (conn net.Conn, restored bool, err error) {
	// /proc/thread-self: namespaces are per thread, and this thread may
	// differ from the process's main thread.
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, fmt.Errorf("opening current netns: %w", err)
	}
	defer func() { _ = orig.Close() }()
	target, err := os.Open(path)
	if err != nil {
		return nil, true, fmt.Errorf("opening netns %s: %w", path, err)
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("entering netns %s: %w", path, err)
	}
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, false, fmt.Errorf("returning from netns %s: %w", path, err)
	}
	if dialErr != nil {
		return nil, true, fmt.Errorf("dialing %s in netns %s: %w", addr, path, dialErr)
	}
	return conn, true, nil
}
