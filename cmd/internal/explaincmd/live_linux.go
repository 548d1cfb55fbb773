package explaincmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/cmd/internal/modeconfig"
	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/proxy"
	"github.com/kproxy/kproxy/platform/linux"
	"github.com/kproxy/kproxy/platform/linux/nftables"
)

// liveIptablesTracer reads the nat and filter tables of fam with
// iptables-save (the flavour the host uses) and the node's addresses.
func liveIptablesTracer(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily) (traced, error) {
	sys, err := linux.NewSystem(fam, linux.FlavourAuto)
	if err != nil {
		return traced{}, fmt.Errorf("%s iptables tools: %w", fam, err)
	}
	local, err := sys.Host.LocalAddresses()
	if err != nil {
		return traced{}, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var save []byte
	for _, table := range []string{"nat", "filter"} {
		out, err := sys.Iptables.Save(ctx, table)
		if err != nil {
			return traced{}, fmt.Errorf("reading the %s table: %w", table, err)
		}
		save = append(save, out...)
	}
	v := FullView(o, snap, fam, local)
	t, err := linux.LiveIptables(modeconfig.IPTables(o, fam), v, save)
	return traced{t, v, local}, err
}

// liveNFTablesTracer reads kproxy's nftables table of fam (nft -j list
// table), the base chains of every table (nft -j list chains) and the
// node's addresses.
func liveNFTablesTracer(ctx context.Context, o *config.Options, snap *proxy.Snapshot, fam v1.IPFamily) (traced, error) {
	local, err := linux.ProcHost().LocalAddresses()
	if err != nil {
		return traced{}, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var in linux.NFTLive
	table, err := runNFT(ctx, "-j", "list", "table", string(nftables.Family(fam)), nftables.TableName)
	switch {
	case err == nil:
		in.Table = table
	case errors.Is(err, errNoTable):
		// No table: nothing of kproxy's is installed (the drift says so).
	default:
		return traced{}, err
	}
	if in.Chains, err = runNFT(ctx, "-j", "list", "chains"); err != nil {
		return traced{}, err
	}
	v := FullView(o, snap, fam, local)
	t, err := linux.LiveNFT(modeconfig.NFTables(o, fam), v, in)
	return traced{t, v, local}, err
}

var errNoTable = errors.New("no such table")

// runNFT runs nft with args and returns what it printed; errNoTable when
// it says the table does not exist.
func runNFT(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No such file or directory") {
			return nil, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), errNoTable, msg)
		}
		return nil, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}
