package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"

	"sigs.k8s.io/knftables"
)

// Interface is the seam to nftables for kproxy's table of one family: Run
// applies a transaction atomically (nothing changes when it fails);
// ListAll and ListRules read the table (a missing table or chain is an
// error IsNotFound recognises).
type Interface interface {
	Run(ctx context.Context, tx *Tx) error
	ListAll(ctx context.Context) (map[string][]string, error)
	ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error)
	ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error)
	// CountRules counts the rules of a chain of the table (0 when the
	// table or the chain is missing). Unlike ListRules its cost does not
	// grow with the table's sets.
	CountRules(ctx context.Context, chain string) (int, error)
}

// System is the real Interface: transactions through "nft -f -" (one
// process per transaction), listings through knftables; a transaction of
// element operations only goes as one netlink batch on a socket System
// keeps open (see nlbatch.go), unless netlink is turned off.
type System struct {
	knftables.Interface
	path   string
	family knftables.Family

	mu sync.Mutex
	// nl is the open socket (nil: not yet, or closed after a failure);
	// noNetlink turns the netlink path off.
	nl        *nlConn
	noNetlink bool
	// netlinkRuns and execRuns count the transactions each way went;
	// dumps the rule counts made over netlink.
	netlinkRuns, execRuns, dumps int
}

var _ Interface = (*System)(nil)

// NewSystem returns the real Interface for family's table (it needs the
// nft tool; knftables checks it can run).
func NewSystem(family knftables.Family) (*System, error) {
	k, err := knftables.New(family, TableName)
	if err != nil {
		return nil, err
	}
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return &System{Interface: k, path: path, family: family}, nil
}

// SetNetlink turns the netlink path for element-only transactions on (the
// default) or off (every transaction through nft -f).
func (s *System) SetNetlink(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noNetlink = !on
	if !on && s.nl != nil {
		s.nl.close()
		s.nl = nil
	}
}

// Runs returns how many transactions went over netlink and through nft -f.
func (s *System) Runs() (netlink, exec int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.netlinkRuns, s.execRuns
}

// RuleDumps returns how many rule counts went over netlink.
func (s *System) RuleDumps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dumps
}

// Close closes the netlink socket, if open.
func (s *System) Close() {
	s.SetNetlink(false)
}

// Run applies the transaction: element operations only as one netlink
// batch (the kernel's error in the error; ENOENT is IsNotFound), anything
// else through nft -f - (nft's error output in the error; IsNotFound
// recognises "No such file or directory" there).
func (s *System) Run(ctx context.Context, tx *Tx) error {
	if ops := tx.Elements(); len(ops) > 0 {
		if done, err := s.runNetlink(tx.Family(), ops); done {
			return err
		}
	} else if pre, bulk, post, ok := tx.Split(); ok {
		if done, err := s.runSplit(ctx, tx.Family(), pre, bulk, post); done {
			return err
		}
	}
	s.mu.Lock()
	s.execRuns++
	s.mu.Unlock()
	return s.exec(ctx, tx)
}

// runNetlink sends ops over the socket; done is false when they must go
// through nft -f instead (netlink off or unavailable, or an operation it
// does not encode).
func (s *System) runNetlink(family knftables.Family, ops []ElemOp) (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.encode(family, ops, maxNetlinkElems)
	if b == nil {
		return false, nil
	}
	if err := s.send(b); err != nil {
		return true, fmt.Errorf("nftables transaction of %d element operations: %w", len(ops), err)
	}
	return true, nil
}

// encode opens the socket if needed and encodes ops as a batch (nil: the
// netlink path is off or unavailable, or ops are not encodable). The
// caller holds s.mu.
func (s *System) encode(family knftables.Family, ops []ElemOp, limit int) *nlBatch {
	if s.noNetlink {
		return nil
	}
	if s.nl == nil {
		c, err := openNetlink()
		if err != nil {
			s.noNetlink = true // nft -f from now on
			return nil
		}
		s.nl = c
	}
	b, err := encodeBatch(family, ops, s.nl.seq, limit)
	if err != nil {
		return nil
	}
	s.nl.seq = b.endSeqNum + 1
	return b
}

// send runs an encoded batch; a failed socket is closed (the next batch
// opens another). The caller holds s.mu.
func (s *System) send(b *nlBatch) error {
	s.netlinkRuns++
	err := s.nl.run(b)
	if err != nil && errors.Is(err, errNetlinkIO) {
		s.nl.close()
		s.nl = nil
	}
	return err
}

// runSplit runs a full transaction in the three parts of Tx.Split: nft -f,
// one netlink batch, nft -f. done is false when it must go through nft -f
// whole (netlink off or unavailable, elements it does not encode); then
// nothing has run.
func (s *System) runSplit(ctx context.Context, family knftables.Family, pre *Tx, bulk []ElemOp, post *Tx) (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.encode(family, bulk, maxBulkElems)
	if b == nil {
		return false, nil
	}
	n := len(bulk)
	bulk = nil // encoded: megabytes the collector may take back
	s.execRuns++
	if err := s.exec(ctx, pre); err != nil {
		return true, fmt.Errorf("full sync, chains and rules (nothing changed): %w", err)
	}
	if err := s.send(b); err != nil {
		return true, fmt.Errorf("full sync, %d element operations over netlink (the chains and rules are new, the elements as before): %w", n, err)
	}
	if post.NumOperations() > 0 {
		s.execRuns++
		if err := s.exec(ctx, post); err != nil {
			return true, fmt.Errorf("full sync, deleting %d chains and sets no longer used: %w", post.NumOperations(), err)
		}
	}
	return true, nil
}

// CountRules implements Interface: over netlink, a rule dump the kernel
// filters by chain; without netlink, through nft (which reads the whole
// table first: at 50,000 Services some 20 s of CPU and a gigabyte of
// memory per listing).
func (s *System) CountRules(ctx context.Context, chain string) (int, error) {
	if n, done, err := s.countNetlink(chain); done {
		return n, err
	}
	rs, err := s.ListRules(ctx, chain)
	if IsNotFound(err) {
		return 0, nil
	}
	return len(rs), err
}

// countNetlink is CountRules over netlink; done is false when netlink is
// off or unavailable.
func (s *System) countNetlink(chain string) (n int, done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	proto, ok := nfproto(s.family)
	if !ok || s.noNetlink {
		return 0, false, nil
	}
	if s.nl == nil {
		c, err := openNetlink()
		if err != nil {
			s.noNetlink = true
			return 0, false, nil
		}
		s.nl = c
	}
	s.dumps++
	n, err = s.nl.countRules(proto, TableName, chain)
	if err != nil && errors.Is(err, errNetlinkIO) {
		s.nl.close()
		s.nl = nil
		return 0, false, nil // through nft this time
	}
	return n, true, err
}

// exec runs nft -f - with the transaction.
func (s *System) exec(ctx context.Context, tx *Tx) error {
	cmd := exec.CommandContext(ctx, s.path, "-f", "-")
	cmd.Stdin = bytes.NewReader(tx.Bytes())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := bytes.TrimSpace(stderr.Bytes())
		if len(msg) > 2000 {
			msg = append(msg[:2000:2000], "..."...)
		}
		if bytes.Contains(msg, []byte("No such file or directory")) {
			return fmt.Errorf("nft -f: %w: %w: %s", err, ErrNotFound, msg)
		}
		return fmt.Errorf("nft -f: %w: %s", err, msg)
	}
	return nil
}

// errno-like refusals, for errors.Is.
var (
	ErrNotFound = errors.New("No such file or directory")
	ErrExists   = errors.New("File exists")
	ErrBusy     = errors.New("Device or resource busy")
	ErrNotSupp  = errors.New("Operation not supported")
)

// IsNotFound reports whether err says an object (the table, a chain) does
// not exist, from the real nft (knftables) or the model's Fake.
func IsNotFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, ErrNotFound)
}
