// Command kproxy-cluster runs make cluster, make cluster-down and make
// node-shell (see package cluster):
//
//	kproxy-cluster [flags] up                     start a cluster in the background, print how to use it
//	kproxy-cluster [flags] down                   stop it and remove everything, also after a crash
//	kproxy-cluster [flags] shell [HOST [CMD...]]  a shell (or CMD) in a host's network namespace (default node1)
//	kproxy-cluster [flags] kubectl [ARGS...]      kubectl in the control-plane namespace
//	kproxy-cluster [flags] run                    the daemon (started by up)
//
// Flags: -dir DIR (default <repository>/.build/cluster), -root ROOT (found
// from the working directory), -proxy kproxy|kube-proxy|none, -mode
// iptables|nftables, -overlay kubeadm|default, -kproxy-image FILE. Needs
// root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kproxy/kproxy/test/cluster"
	"github.com/kproxy/kproxy/test/controlplane"
)

func main() {
	var o cluster.Options
	flag.StringVar(&o.Dir, "dir", "", "state directory (default <repository>/.build/cluster)")
	flag.StringVar(&o.Root, "root", "", "kproxy repository root (default: found from the working directory)")
	flag.StringVar(&o.Proxy, "proxy", cluster.ProxyKproxy, "the Service proxy: kproxy (deploy/, make images' image), kube-proxy (upstream v1.37.2) or none (install one yourself; kproxy's image is imported)")
	flag.StringVar(&o.Mode, "mode", "iptables", "the proxy mode: iptables or nftables")
	flag.StringVar(&o.Overlay, "overlay", "kubeadm", "how kproxy is applied: kubeadm (deploy/overlays/kubeadm) or default (deploy/)")
	flag.StringVar(&o.KproxyImage, "kproxy-image", "", "kproxy's image archive (default <repository>/.build/images/kproxy-linux-amd64.oci.tar, from make images)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: kproxy-cluster [flags] up|down|run|shell [HOST [CMD...]]|kubectl [ARGS...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(o, flag.Arg(0), flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-cluster:", err)
		os.Exit(1)
	}
}

func run(o cluster.Options, cmd string, args []string) error {
	if o.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.Root, err = controlplane.RepoRoot(wd); err != nil {
			return fmt.Errorf("%w (run it inside the kproxy repository, or pass -root)", err)
		}
	}
	switch cmd {
	case "up", "run", "down":
		if len(args) > 0 {
			return fmt.Errorf("%s takes no arguments", cmd)
		}
		// Builds run in the repository.
		if err := os.Chdir(o.Root); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		switch cmd {
		case "up":
			return cluster.Up(ctx, o)
		case "run":
			return cluster.Run(ctx, o)
		default:
			return cluster.Down(ctx, o)
		}
	case "shell":
		host := ""
		if len(args) > 0 {
			host, args = args[0], args[1:]
		}
		return cluster.Shell(o, host, args)
	case "kubectl":
		return cluster.Kubectl(o, args)
	}
	return errors.New("unknown command " + cmd + " (want up, down, run, shell or kubectl)")
}
