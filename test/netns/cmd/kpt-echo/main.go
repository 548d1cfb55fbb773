// Command kpt-echo is the echo server and client of kproxy's kernel tests and
// demo (see package echo).
//
//	kpt-echo serve -name pod-a1 [-port 8080]
//	    serve TCP and UDP on IPv4 and IPv6; prints "ready" once listening;
//	    stops on SIGTERM or SIGINT.
//	kpt-echo probe -proto tcp|udp -addr IP:PORT [-count 1] [-timeout 2s] [-json]
//	    make count new connections, one line per attempt:
//	    "answer <server> <client address seen>", "rejected ...", "dropped ...".
//	    Exits 0 when every attempt was answered, 1 otherwise.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kproxy/kproxy/test/netns/echo"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "probe":
		var ok bool
		ok, err = probe(os.Args[2:])
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kpt-echo:", err)
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kpt-echo serve -name NAME [-port 8080] | probe -proto tcp|udp -addr IP:PORT [-count N] [-timeout D] [-json]")
	os.Exit(2)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	name := fs.String("name", "", "name to answer with (required)")
	port := fs.Int("port", 8080, "TCP and UDP port")
	_ = fs.Parse(args)
	if *name == "" {
		return fmt.Errorf("serve: -name is required")
	}
	s, err := echo.Listen(*name, *port)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println("ready")
	s.Serve(ctx)
	return nil
}

func probe(args []string) (bool, error) {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	proto := fs.String("proto", "tcp", "tcp or udp")
	addrFlag := fs.String("addr", "", "IP:PORT to probe (required)")
	count := fs.Int("count", 1, "number of new connections (1..10000)")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of each attempt")
	asJSON := fs.Bool("json", false, "print one JSON object per attempt")
	_ = fs.Parse(args)
	addr, err := netip.ParseAddrPort(*addrFlag)
	if err != nil {
		return false, fmt.Errorf("probe: -addr: %w", err)
	}
	if *count < 1 || *count > 10000 {
		return false, fmt.Errorf("probe: -count %d out of range 1..10000", *count)
	}
	all := true
	enc := json.NewEncoder(os.Stdout)
	for i := 0; i < *count; i++ {
		r := echo.Probe(context.Background(), *proto, addr, echo.ProbeOptions{Timeout: *timeout})
		all = all && r.Outcome == echo.Answer
		if *asJSON {
			errText := ""
			if r.Err != nil {
				errText = r.Err.Error()
			}
			_ = enc.Encode(map[string]string{"outcome": string(r.Outcome), "server": r.Reply.Name,
				"source": r.Source.String(), "error": errText, "elapsed": r.Elapsed.String()})
			continue
		}
		if r.Outcome == echo.Answer {
			fmt.Printf("answer %s %s\n", r.Reply.Name, r.Source)
		} else {
			fmt.Printf("%s %v\n", r.Outcome, r.Err)
		}
	}
	return all, nil
}
