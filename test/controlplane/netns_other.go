//go:build !linux

package controlplane

import (
	"context"
	"errors"
	"net"
)

// errNoNetns is returned by NetnsDialer's dialer outside Linux.
var errNoNetns = errors.New("network namespaces exist only on Linux")

// NetnsDialer returns a dialer that always fails: network namespaces exist
// only on Linux.
func NetnsDialer(_ string) DialFunc {
	return func(context.Context, string, string) (net.Conn, error) {
		return nil, errNoNetns
	}
}
