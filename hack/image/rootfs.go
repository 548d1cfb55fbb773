// Package image assembles kproxy's Linux image without a container engine
// or registry: Debian's packages of the tools kproxy runs, and their
// dependency closure, downloaded with apt-get and unpacked with dpkg-deb
// into a root filesystem, kproxy added, the tools checked, and the tree
// written as an OCI archive by hack/image/oci. make images runs it
// (hack/image/cmd/kproxy-image); the image test in test/e2e runs
// the result with runc.
package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Packages are the Debian packages the image is made of (plus their
// dependencies): iptables has iptables-legacy*, iptables-nft* and their
// ip6tables twins; nftables has nft; ipset destroys kube-proxy's ipvs-mode
// sets on --cleanup; kmod has modprobe, which the DaemonSet's init container
// and iptables-legacy run; conntrack is for whoever debugs the node; dash is
// the init container's /bin/sh.
var Packages = []string{"iptables", "nftables", "conntrack", "ipset", "kmod", "dash"}

// Tool is a command the image must hold, and who runs it.
type Tool struct {
	Name string
	Why  string
}

// Tools are the commands kproxy executes (TestToolsCoverExecs compares the
// list with the exec calls in the code) and those the DaemonSet's init
// container runs.
func Tools() []Tool {
	var out []Tool
	for _, base := range []string{"iptables", "ip6tables"} {
		out = append(out, Tool{base, "flavour detection (" + base + " --version)"})
		for _, f := range []string{"legacy", "nft"} {
			for _, kind := range []string{"", "-save", "-restore"} {
				out = append(out, Tool{base + "-" + f + kind, "the iptables mode, " + f + " flavour"})
			}
		}
	}
	return append(out,
		Tool{"nft", "the nftables mode; deleting kube-proxy's nftables tables"},
		Tool{"ipset", "--cleanup of kube-proxy's ipvs mode"},
		Tool{"conntrack", "debugging (kproxy itself uses netlink)"},
		Tool{"modprobe", "the init container; iptables-legacy's module loading"},
		Tool{"sh", "the init container's command"},
	)
}

// searchPath is where CheckTools looks, in order (Debian's root PATH).
var searchPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// CheckTools reports every tool that is not an executable file in the
// root filesystem's PATH (symbolic links are followed inside root).
func CheckTools(root string, tools []Tool) error {
	var errs []error
	for _, t := range tools {
		found := false
		for _, dir := range searchPath {
			if p, err := resolve(root, path.Join(dir, t.Name)); err == nil {
				if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
					found = true
					break
				}
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("the image has no %s (needed for %s)", t.Name, t.Why))
		}
	}
	return errors.Join(errs...)
}

// resolve follows symbolic links of name (an absolute path in the image)
// as the image would see them, and returns the host path.
func resolve(root, name string) (string, error) {
	for range 40 {
		p := filepath.Join(root, filepath.FromSlash(name))
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(name), target)
		}
		name = path.Clean(target)
	}
	return "", fmt.Errorf("%s: too many symbolic links", name)
}

// Pkg is one resolved package.
type Pkg struct{ Name, Version, Arch string }

// File is the file name apt-get gives the package's .deb.
func (p Pkg) File() string {
	return p.Name + "_" + strings.ReplaceAll(p.Version, ":", "%3a") + "_" + p.Arch + ".deb"
}

// apt runs apt-get as if nothing were installed: a private, empty dpkg
// status and private archives directory under cache, so that the machine's
// own installed packages neither count nor change. The package lists are
// the machine's (apt-get update).
func apt(ctx context.Context, cache string, args ...string) ([]byte, error) {
	status := filepath.Join(cache, "status")
	archives := filepath.Join(cache, "archives")
	if err := os.MkdirAll(filepath.Join(archives, "partial"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(status, nil, 0o644); err != nil {
		return nil, err
	}
	argv := append([]string{
		"-q", "-o", "Dir::State::status=" + status,
		"-o", "Dir::Cache::archives=" + archives,
		"-o", "Debug::NoLocking=1",
		"-o", "APT::Install-Recommends=false",
		"-o", "APT::Install-Suggests=false",
	}, args...)
	cmd := exec.CommandContext(ctx, "apt-get", argv...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// instLine is apt-get -s's line for a package to install:
// "Inst libc6 (2.36-9+deb12u14 Debian-Security:12/stable-security [amd64])",
// sometimes followed by " []".
var instLine = regexp.MustCompile(`(?m)^Inst (\S+) \((\S+) [^\n]*?\[([^\]\s]+)\]\)`)

// Resolve returns the packages, with their dependency closure, that apt-get
// would install on an empty system, sorted by name.
func Resolve(ctx context.Context, cache string, pkgs []string) ([]Pkg, error) {
	out, err := apt(ctx, cache, append([]string{"-s", "install"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("resolving %v (are the package lists there? apt-get update): %w", pkgs, err)
	}
	res := parseInst(out)
	if len(res) == 0 {
		return nil, fmt.Errorf("apt-get resolved no package for %v:\n%s", pkgs, out)
	}
	return res, nil
}

// parseInst returns the packages of apt-get -s's Inst lines, sorted by name.
func parseInst(out []byte) []Pkg {
	var res []Pkg
	for _, m := range instLine.FindAllStringSubmatch(string(out), -1) {
		res = append(res, Pkg{Name: m[1], Version: m[2], Arch: m[3]})
	}
	sort.Slice(res, func(i, j int) bool { return res[i].Name < res[j].Name })
	return res
}

// Download fetches the packages' .debs into cache (those already there are
// kept) and returns their paths.
func Download(ctx context.Context, cache string, pkgs []Pkg) ([]string, error) {
	var spec []string
	for _, p := range pkgs {
		spec = append(spec, p.Name+"="+p.Version)
	}
	if _, err := apt(ctx, cache, append([]string{"--download-only", "-y", "install"}, spec...)...); err != nil {
		return nil, fmt.Errorf("downloading packages: %w", err)
	}
	var debs []string
	for _, p := range pkgs {
		f := filepath.Join(cache, "archives", p.File())
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("package %s %s: %w", p.Name, p.Version, err)
		}
		debs = append(debs, f)
	}
	return debs, nil
}

// Unpack extracts the .debs into root (Extract), then does by hand what
// iptables' maintainer scripts would do (the alternatives) and adds the
// directories the DaemonSets mount.
func Unpack(ctx context.Context, root string, debs []string) error {
	if err := Extract(ctx, root, debs); err != nil {
		return err
	}
	// iptables' postinst registers these alternatives; nft is Debian's
	// default flavour (higher priority).
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, kind := range []string{"", "-save", "-restore"} {
			link := filepath.Join(root, "usr/sbin", base+kind)
			if err := os.Symlink(base+"-nft"+kind, link); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("alternative %s: %w", base+kind, err)
			}
		}
	}
	return MakeDirs(root, Dir{"var/lib/kproxy", 0o755}, Dir{"lib/modules", 0o755})
}

// Dir is a directory of an image and its mode.
type Dir struct {
	Name string
	Mode fs.FileMode
}

// MakeDirs creates the directories under root with exactly their modes.
func MakeDirs(root string, dirs ...Dir) error {
	for _, d := range dirs {
		p := filepath.Join(root, d.Name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.Mode); err != nil {
			return err
		}
	}
	return nil
}

// Extract unpacks the .debs into root (dpkg-deb -x: files only, no
// maintainer scripts), trims what a container does not need
// (documentation but the copyright files, manual pages, translations) and
// creates the directories a runtime mounts over (proc, sys, dev, run, tmp).
// Any image made of Debian packages starts here (kproxy's, and the test
// images of make cluster).
func Extract(ctx context.Context, root string, debs []string) error {
	for _, d := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", d, root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %w\n%s", d, err, out)
		}
	}
	for _, dir := range []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/bash-completion"} {
		if err := os.RemoveAll(filepath.Join(root, dir)); err != nil {
			return err
		}
	}
	docs := filepath.Join(root, "usr/share/doc")
	err := filepath.WalkDir(docs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() != "copyright" {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("trimming %s: %w", docs, err)
	}
	return MakeDirs(root, Dir{"proc", 0o555}, Dir{"sys", 0o555}, Dir{"dev", 0o755}, Dir{"run", 0o755}, Dir{"tmp", 0o777 | fs.ModeSticky})
}
