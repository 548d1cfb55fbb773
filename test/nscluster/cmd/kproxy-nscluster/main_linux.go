// Command kproxy-nscluster runs make netns-cluster, make netns-cluster-down and make
// shell (see package cluster):
//
//	kproxy-nscluster [-dir DIR] [-root ROOT] up          start a cluster in the background, print how to use it
//	kproxy-nscluster [-dir DIR] [-root ROOT] down        stop it and remove everything
//	kproxy-nscluster [-dir DIR] shell [HOST [CMD...]]    a shell (or CMD) in a host's namespace (default: client)
//	kproxy-nscluster [-dir DIR] kubectl [ARGS...]        kubectl in the control-plane namespace
//	kproxy-nscluster [-dir DIR] [-root ROOT] run         the daemon (started by up)
//
// DIR defaults to <repository>/.build/nscluster; ROOT is found from the
// working directory. Needs root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/nscluster"
)

func main() {
	dir := flag.String("dir", "", "state directory (default <repository>/.build/nscluster)")
	root := flag.String("root", "", "kproxy repository root (default: found from the working directory)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: kproxy-nscluster [-dir DIR] [-root ROOT] up|down|run|shell [HOST [CMD...]]|kubectl [ARGS...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*dir, *root, flag.Arg(0), flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-nscluster:", err)
		os.Exit(1)
	}
}

func run(dir, root, cmd string, args []string) error {
	if root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if root, err = controlplane.RepoRoot(wd); err != nil {
			return fmt.Errorf("%w (run it inside the kproxy repository, or pass -root)", err)
		}
	}
	o := nscluster.Options{Dir: dir, Root: root}
	switch cmd {
	case "up", "run", "down":
		if len(args) > 0 {
			return fmt.Errorf("%s takes no arguments", cmd)
		}
		// Builds run in the repository (go build ./...).
		if err := os.Chdir(root); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		switch cmd {
		case "up":
			return nscluster.Up(ctx, o)
		case "run":
			return nscluster.Run(ctx, o)
		default:
			return nscluster.Down(ctx, o)
		}
	case "shell":
		host := ""
		if len(args) > 0 {
			host, args = args[0], args[1:]
		}
		return nscluster.Shell(o, host, args)
	case "kubectl":
		return nscluster.Kubectl(o, args)
	}
	return errors.New("unknown command " + cmd + " (want up, down, run, shell or kubectl)")
}
