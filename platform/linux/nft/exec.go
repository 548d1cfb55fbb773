package nft

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"

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
}

// System is the real Interface: transactions through "nft -f -" (one
// process per transaction), listings through knftables.
type System struct {
	knftables.Interface
	path string
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
	return &System{Interface: k, path: path}, nil
}

// Run runs nft -f - with the transaction; nft's error output is in the
// error (IsNotFound recognises "No such file or directory" there).
func (s *System) Run(ctx context.Context, tx *Tx) error {
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
