package linux

import (
	"bytes"
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// Flavour is the iptables back end: the legacy xtables kernel API or
// nf_tables (iptables-nft). kproxy never mixes them.
type Flavour string

// Flavours.
const (
	// FlavourAuto follows the host: whichever flavour holds more rules, else
	// the system's default iptables.
	FlavourAuto   Flavour = ""
	FlavourLegacy Flavour = "legacy"
	FlavourNFT    Flavour = "nft"
)

// ParseFlavour parses "auto", "legacy" or "nft".
func ParseFlavour(s string) (Flavour, error) {
	switch s {
	case "", "auto":
		return FlavourAuto, nil
	case "legacy":
		return FlavourLegacy, nil
	case "nft", "nf_tables":
		return FlavourNFT, nil
	}
	return "", fmt.Errorf("iptables flavour %q: want auto, legacy or nft", s)
}

// Commands names the tools of one family and flavour.
type Commands struct {
	Iptables, Restore, Save string
}

// CommandsFor returns the tool names, e.g. ip6tables-nft-restore.
func CommandsFor(family v1.IPFamily, f Flavour) Commands {
	base := "iptables"
	if family == v1.IPv6Protocol {
		base = "ip6tables"
	}
	return Commands{
		Iptables: base + "-" + string(f),
		Restore:  base + "-" + string(f) + "-restore",
		Save:     base + "-" + string(f) + "-save",
	}
}

// FlavourProbe is what detection looks at: the iptables-save output of each
// flavour (nil when its tools are missing) and the system default (the
// flavour "iptables --version" reports, "" when unknown).
type FlavourProbe struct {
	LegacySave, NFTSave []byte
	LegacyOK, NFTOK     bool
	SystemDefault       Flavour
	// LegacyHint and NFTHint tell whether the flavour's mangle table holds
	// the chains kubelet creates in the flavour it uses (KUBE-IPTABLES-HINT,
	// KUBE-KUBELET-CANARY).
	LegacyHint, NFTHint bool
}

// kubeletHints are the mangle chains kubelet creates in its flavour.
var kubeletHints = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// HasKubeletHint reports whether iptables-save output of the mangle table
// declares one of kubelet's hint chains.
func HasKubeletHint(mangle []byte) bool {
	for _, c := range ChainNames(mangle) {
		for _, h := range kubeletHints {
			if c == h {
				return true
			}
		}
	}
	return false
}

// countRules counts the rules in iptables-save output.
func countRules(save []byte) int { return bytes.Count(save, []byte("\n-A ")) }

// ChooseFlavour picks the flavour the host already uses, the way
// kubernetes-sigs/iptables-wrappers does: the one where kubelet left its
// hint chain (when only one has it); else the one with more rules; on a tie
// the system default; else nft when its tools exist.
func ChooseFlavour(p FlavourProbe) (Flavour, error) {
	switch {
	case !p.LegacyOK && !p.NFTOK:
		return "", fmt.Errorf("neither iptables-legacy nor iptables-nft tools are installed")
	case !p.LegacyOK:
		return FlavourNFT, nil
	case !p.NFTOK:
		return FlavourLegacy, nil
	case p.LegacyHint && !p.NFTHint:
		return FlavourLegacy, nil
	case p.NFTHint && !p.LegacyHint:
		return FlavourNFT, nil
	}
	l, n := countRules(p.LegacySave), countRules(p.NFTSave)
	switch {
	case l > n:
		return FlavourLegacy, nil
	case n > l:
		return FlavourNFT, nil
	case p.SystemDefault != FlavourAuto:
		return p.SystemDefault, nil
	}
	return FlavourNFT, nil
}
