//go:build !linux

package nftables

import "errors"

// nlConn exists on Linux only.
type nlConn struct{ seq uint32 }

var errNetlinkIO = errors.New("netlink socket")

func openNetlink() (*nlConn, error) { return nil, errors.New("netlink: Linux only") }

func (c *nlConn) close() {}

func (c *nlConn) run(*nlBatch) error { return errNetlinkIO }

func (c *nlConn) countRules(uint8, string, string) (int, error) { return 0, errNetlinkIO }

// ListTables exists on Linux only.
func ListTables() ([]string, error) { return nil, errors.New("netlink: Linux only") }
