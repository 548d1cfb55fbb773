package image

import (
	"fmt"
	"path"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// KproxyPaths are where the image holds kproxy itself (kube-proxy is a link
// to it), besides the Tools that come from Debian's packages.
var KproxyPaths = []string{"/usr/local/bin/kproxy", "/usr/local/bin/kube-proxy"}

// kproxySubcommands are the first arguments that make kproxy run a
// subcommand; any other first argument that is not a flag is an error
// (kproxy takes no arguments).
var kproxySubcommands = map[string]bool{"explain": true, "check-hns": true, "help": true, "idle": true}

// shellBuiltins are the words dash runs itself: no file in the image is
// needed for them.
var shellBuiltins = map[string]bool{
	"echo": true, "printf": true, "exit": true, "true": true, "false": true, "trap": true, "wait": true,
	"read": true, "set": true, "export": true, "cd": true, "test": true, "[": true, "kill": true,
	":": true, "unset": true, "shift": true, "return": true, "local": true,
}

// Run is one program a container runs, and where.
type Run struct {
	Where   string // "DaemonSet/kube-system/kproxy container init"
	Program string // as written: an absolute path or a name looked up in PATH
	Args    []string
}

// PodRuns returns the programs the containers of spec run: each
// container's command (the image's entrypoint, /usr/local/bin/kproxy, when
// it has none), and, for a shell (`sh -c SCRIPT`), also the first word of
// every command of the script (after exec). where prefixes each Run's
// Where.
func PodRuns(where string, spec *v1.PodSpec) []Run {
	var out []Run
	var all []v1.Container
	all = append(all, spec.InitContainers...)
	all = append(all, spec.Containers...)
	for _, c := range all {
		w := where + " container " + c.Name
		argv := append(append([]string(nil), c.Command...), c.Args...)
		if len(c.Command) == 0 {
			argv = append([]string{KproxyPaths[0]}, c.Args...)
		}
		out = append(out, Run{Where: w, Program: argv[0], Args: argv[1:]})
		if path.Base(argv[0]) == "sh" && len(argv) >= 3 && argv[1] == "-c" {
			for _, words := range scriptCommands(argv[2]) {
				out = append(out, Run{Where: w + " (its script)", Program: words[0], Args: words[1:]})
			}
		}
	}
	return out
}

// scriptCommands splits a shell script into simple commands (lines joined
// at a trailing backslash, then split at ;, &&, || and |) and returns the
// words of each that names a program: builtins are left out, exec's
// program is kept. It reads scripts as plain as deploy/'s: no quoting of
// separators, no subshells, no variables in command position.
func scriptCommands(script string) [][]string {
	script = strings.ReplaceAll(script, "\\\n", " ")
	var out [][]string
	for _, line := range strings.Split(script, "\n") {
		if i := strings.Index(line, "#"); i >= 0 && (i == 0 || line[i-1] == ' ') {
			line = line[:i]
		}
		for _, sep := range []string{"&&", "||", "|"} {
			line = strings.ReplaceAll(line, sep, ";")
		}
		for _, cmd := range strings.Split(line, ";") {
			words := strings.Fields(cmd)
			for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "=") {
				words = words[1:] // VAR=value before the command
			}
			if len(words) > 0 && words[0] == "exec" {
				words = words[1:]
			}
			if len(words) == 0 || shellBuiltins[words[0]] {
				continue
			}
			out = append(out, words)
		}
	}
	return out
}

// CheckRuns returns an error naming every Run whose program the image does
// not hold: kproxy at one of KproxyPaths (and then its first argument,
// when not a flag, must be a subcommand kproxy has), or a Tool (by name,
// or by an absolute path in the search path CheckTools uses).
func CheckRuns(runs []Run, tools []Tool) error {
	have := map[string]bool{}
	for _, t := range tools {
		have[t.Name] = true
	}
	var bad []string
	for _, r := range runs {
		p := r.Program
		switch {
		case p == KproxyPaths[0] || p == KproxyPaths[1] || p == "kproxy" || p == "kube-proxy":
			if len(r.Args) > 0 && !strings.HasPrefix(r.Args[0], "-") && !kproxySubcommands[r.Args[0]] {
				bad = append(bad, fmt.Sprintf("%s: kproxy has no subcommand %q", r.Where, r.Args[0]))
			}
		case strings.HasPrefix(p, "/"):
			if !inSearchPath(path.Dir(p)) || !have[path.Base(p)] {
				bad = append(bad, fmt.Sprintf("%s runs %s, which the image does not hold (not among its tools)", r.Where, p))
			}
		case strings.Contains(p, "/") || strings.Contains(p, "$"):
			bad = append(bad, fmt.Sprintf("%s runs %q: a relative or computed program cannot be checked", r.Where, p))
		default:
			if !have[p] {
				bad = append(bad, fmt.Sprintf("%s runs %s, which the image does not hold (not among its tools)", r.Where, p))
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%d program(s) missing from the Linux image:\n  %s", len(bad), strings.Join(bad, "\n  "))
}

func inSearchPath(dir string) bool {
	for _, d := range searchPath {
		if d == dir {
			return true
		}
	}
	return false
}
