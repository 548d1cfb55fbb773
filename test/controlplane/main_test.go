package controlplane

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envFake makes the test binary act as a stand-in program instead of running
// tests, so process handling and builds are tested without real servers or a
// real compiler. Values:
//
//	exit         print a line and exit 3 (a server that fails to start)
//	sleep        block until SIGTERM, then exit 0 (a server that never gets ready)
//	ignore-term  ignore SIGTERM and block (only SIGKILL ends it)
//	go           a fake "go build": write the -o file with what it was asked to build
const envFake = "KPROXY_CONTROLPLANE_FAKE"

func TestMain(m *testing.M) {
	switch os.Getenv(envFake) {
	case "":
		os.Exit(m.Run())
	case "exit":
		fmt.Println("fake server: cannot start")
		os.Exit(3)
	case "sleep":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, os.Interrupt)
		fmt.Println("fake server: waiting")
		<-ch
		os.Exit(0)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("fake server: ignoring SIGTERM")
		time.Sleep(time.Hour)
		os.Exit(0)
	case "go":
		os.Exit(fakeGo(os.Args[1:]))
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", envFake, os.Getenv(envFake))
		os.Exit(2)
	}
}

// fakeGo implements "build ... -o OUT PKG" (and "test -c ...") by writing a description of the
// request into OUT.
func fakeGo(args []string) int {
	verb := ""
	switch {
	case len(args) > 0 && args[0] == "build":
		verb, args = "build", args[1:]
	case len(args) > 2 && args[0] == "test" && args[1] == "-c" && args[2] == "-vet=off":
		verb, args = "test -c -vet=off", args[3:]
	default:
		fmt.Fprintf(os.Stderr, "fake go: want build or test -c, got %q\n", args)
		return 2
	}
	var out, ldflags, tags string
	for i := 0; i < len(args)-1; i++ {
		switch args[i] {
		case "-o":
			out = args[i+1]
		case "-ldflags":
			ldflags = args[i+1]
		case "-tags":
			tags = args[i+1]
		}
	}
	if out == "" {
		fmt.Fprintln(os.Stderr, "fake go: no -o")
		return 2
	}
	if os.Getenv("KPROXY_CONTROLPLANE_FAKE_GO_FAIL") != "" {
		fmt.Fprintln(os.Stderr, "fake go: compile error in "+args[len(args)-1])
		return 1
	}
	wd, _ := os.Getwd()
	desc := strings.Join([]string{
		"verb=" + verb,
		"tags=" + tags,
		"dir=" + filepath.ToSlash(wd),
		"pkg=" + args[len(args)-1],
		"ldflags=" + ldflags,
		"GOWORK=" + os.Getenv("GOWORK"),
		"CGO_ENABLED=" + os.Getenv("CGO_ENABLED"),
		"GOFLAGS=" + os.Getenv("GOFLAGS"),
	}, "\n")
	if err := os.WriteFile(out, []byte(desc), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
