package nftables

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// nlConn is a netfilter netlink socket kept open between transactions (see
// nlbatch.go). It is bound to the network namespace of the thread that
// opened it.
type nlConn struct {
	fd  int
	seq uint32
	buf []byte
	// sndbuf and rcvbuf are the buffer sizes asked for: a batch must fit
	// in the first, the kernel's answers to all its messages in the
	// second (it drops what does not fit, and the batch's outcome is lost).
	sndbuf, rcvbuf int
}

// ackRoom is the receive buffer one acknowledgement takes (the kernel
// counts a small message's socket buffer, not its bytes).
const ackRoom = 2048

// nlTimeout bounds the wait for the kernel's answers to one batch.
const nlTimeout = 10 * time.Second

func openNetlink() (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	c := &nlConn{fd: fd, seq: uint32(time.Now().Unix()), buf: make([]byte, 1<<16)}
	// Errors carry the failed message's header only, not its payload.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	c.sndbuf = 4 << 20
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, c.sndbuf); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, c.sndbuf)
	}
	if c.rcvbuf, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); err != nil {
		c.rcvbuf = 0
	}
	tv := unix.NsecToTimeval(nlTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return c, nil
}

func (c *nlConn) close() { unix.Close(c.fd) }

// dump sends a dump request (sequence number seq) and hands each buffer
// of answers to read until it says the dump is done; a socket error wraps
// errNetlinkIO.
func (c *nlConn) dump(req []byte, seq uint32, read func([]byte) (done bool, err error)) error {
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("%w: send: %w", errNetlinkIO, err)
	}
	deadline := time.Now().Add(nlTimeout)
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: receive: %w", errNetlinkIO, err)
		}
		done, err := read(c.buf[:n])
		if done {
			return err
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errNetlinkIO, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the dump did not end within %v", errNetlinkIO, nlTimeout)
		}
	}
}

// ListTables lists every nftables table of the current network namespace
// as "family name", by a table dump over netlink on a socket of its own:
// the kernel sends the tables' names only, where "nft list tables" reads
// every table into its cache first, elements included (minutes at 100,000
// Services).
func ListTables() ([]string, error) {
	c, err := openNetlink()
	if err != nil {
		return nil, err
	}
	defer c.close()
	c.seq++
	seq := c.seq
	var out []string
	err = c.dump(encodeTableDump(seq), seq, func(b []byte) (bool, error) {
		tables, done, err := dumpedTables(b, seq)
		out = append(out, tables...)
		return done, err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink: listing the tables: %w", err)
	}
	return out, nil
}

// countRules counts the rules of one chain of table by a rule dump (see
// encodeRuleDump). A missing table or chain counts no rule. An error
// wrapping errNetlinkIO says the socket failed.
func (c *nlConn) countRules(proto uint8, table, chain string) (int, error) {
	c.seq++
	seq := c.seq
	total := 0
	err := c.dump(encodeRuleDump(proto, table, chain, seq), seq, func(b []byte) (bool, error) {
		rules, done, err := countDumpedRules(b, seq)
		total += rules
		return done, err
	})
	return total, err
}

// errNetlinkIO says the socket failed (not the transaction): the socket is
// closed and the transaction's outcome is unknown.
var errNetlinkIO = errors.New("netlink socket")

// run sends ops as one batch and waits for the kernel's answer to each
// message. It returns an error wrapping errNetlinkIO when the socket
// failed; the caller then closes it.
func (c *nlConn) run(b *nlBatch) error {
	// A full sync's batch is larger than the hot path's (megabytes, a few
	// hundred messages): grow the buffers first.
	if need := b.size() + 64<<10; need > c.sndbuf {
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, need); err != nil {
			return fmt.Errorf("%w: a send buffer of %d bytes: %w", errNetlinkIO, need, err)
		}
		c.sndbuf = need
	}
	if need := (b.messages + 2) * ackRoom; need > c.rcvbuf {
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, need); err != nil {
			return fmt.Errorf("%w: a receive buffer of %d bytes: %w", errNetlinkIO, need, err)
		}
		c.rcvbuf = need
	}
	// One datagram from all the buffers.
	if n, err := unix.SendmsgBuffers(c.fd, b.data, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return fmt.Errorf("%w: send: %w", errNetlinkIO, err)
	} else if n != b.size() {
		return fmt.Errorf("%w: sent %d bytes of %d", errNetlinkIO, n, b.size())
	}
	st := newAckState(b)
	deadline := time.Now().Add(nlTimeout)
	for !st.done() {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: receive: %w", errNetlinkIO, err)
		}
		if err := st.read(c.buf[:n]); err != nil {
			return fmt.Errorf("%w: %w", errNetlinkIO, err)
		}
		if !st.done() && time.Now().After(deadline) {
			return fmt.Errorf("%w: no answer within %v", errNetlinkIO, nlTimeout)
		}
	}
	return st.err
}
