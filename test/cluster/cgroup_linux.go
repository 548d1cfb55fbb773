package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroups is the cluster's cgroup, Name below the root of every hierarchy
// (cgroup v1: one per controller; v2: the unified one). The daemon joins
// Name/daemon, so every process it starts is below Name; each kubelet puts
// its pods below Name/<node> (its cgroupRoot). Killing every process below
// Name stops the cluster whatever state it was left in.
type cgroups struct {
	Name string
	// Roots are the hierarchies' mount points; Kill is the one whose
	// cgroup.procs files list every process (pids on v1, the unified one on
	// v2).
	Roots []string
	Kill  string
	V2    bool
}

// detectCgroups finds the mounted hierarchies in /proc/self/mountinfo.
func detectCgroups(name string) (*cgroups, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return parseCgroupMounts(f, name)
}

// parseCgroupMounts reads the cgroup hierarchies of a mountinfo file. On a
// hybrid host (v1 controllers plus a unified hierarchy without
// controllers, as here) the v1 hierarchies are the kubelet's and the
// cluster's, and the unified one is among Roots too: runc makes every
// container's cgroup there as well, and Down must remove them.
func parseCgroupMounts(r io.Reader, name string) (*cgroups, error) {
	var v1 []string
	var unified, pids string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, fl := range fields {
			if fl == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+3 || len(fields) < 5 {
			continue
		}
		mnt, fstype, opts := unescapeMountPath(fields[4]), fields[sep+1], fields[sep+3]
		switch fstype {
		case "cgroup2":
			unified = mnt
		case "cgroup":
			v1 = append(v1, mnt)
			for _, o := range strings.Split(opts, ",") {
				if o == "pids" {
					pids = mnt
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	switch {
	case len(v1) > 0 && pids != "":
		if unified != "" {
			v1 = append(v1, unified)
		}
		sort.Strings(v1)
		return &cgroups{Name: name, Roots: v1, Kill: pids}, nil
	case unified != "":
		return &cgroups{Name: name, Roots: []string{unified}, Kill: unified, V2: true}, nil
	}
	return nil, errors.New("no cgroup hierarchy with the pids controller (v1) and no unified hierarchy (v2) is mounted")
}

// path is sub (e.g. "daemon", "node1") of the cluster's cgroup in root.
func (c *cgroups) path(root string, sub ...string) string {
	return filepath.Join(append([]string{root, c.Name}, sub...)...)
}

// create makes the cluster's cgroup and sub in every hierarchy. On v1 a new
// cpuset cgroup gets its parent's CPUs and memory nodes (it starts empty,
// and no process could join it); on v2 the controllers a kubelet needs are
// enabled for the cluster's children.
func (c *cgroups) create(sub ...string) error {
	for _, root := range c.Roots {
		parts := append([]string{""}, sub...)
		for i := range parts {
			p := c.path(root, parts[1:i+1]...)
			if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", p, err)
			}
			if !c.V2 {
				if err := inheritCpuset(p); err != nil {
					return err
				}
			}
		}
	}
	if c.V2 {
		// Controllers flow down: enable in the root's subtree (for the
		// cluster's cgroup) and in the cluster's (for its children).
		for _, p := range []string{c.Roots[0], c.path(c.Roots[0])} {
			ctrls, err := os.ReadFile(filepath.Join(p, "cgroup.controllers"))
			if err != nil {
				return err
			}
			var plus []string
			for _, ctl := range strings.Fields(string(ctrls)) {
				plus = append(plus, "+"+ctl)
			}
			if len(plus) > 0 {
				if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte(strings.Join(plus, " ")), 0o644); err != nil {
					return fmt.Errorf("enabling controllers in %s: %w", p, err)
				}
			}
		}
	}
	return nil
}

// inheritCpuset copies cpuset.cpus and cpuset.mems from the parent of a v1
// cpuset cgroup that has none (other hierarchies have no such files).
func inheritCpuset(p string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(p, f))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(p), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(p, f), parent, 0o644); err != nil {
			return fmt.Errorf("%s/%s: %w", p, f, err)
		}
	}
	return nil
}

// join moves pid into sub of the cluster's cgroup in every hierarchy.
func (c *cgroups) join(pid int, sub ...string) error {
	for _, root := range c.Roots {
		p := filepath.Join(c.path(root, sub...), "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("joining %s: %w", p, err)
		}
	}
	return nil
}

// pids lists the processes below the cluster's cgroup.
func (c *cgroups) pids() []int {
	var out []int
	_ = filepath.WalkDir(c.path(c.Kill), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

// killAll sends SIGKILL to every process below the cluster's cgroup until
// none is left (a process may fork while it is being killed), at most
// limit, and returns how many it killed.
func (c *cgroups) killAll(limit time.Duration) (int, error) {
	killed := map[int]bool{}
	deadline := time.Now().Add(limit)
	for {
		pids := c.pids()
		if len(pids) == 0 {
			return len(killed), nil
		}
		if time.Now().After(deadline) {
			return len(killed), fmt.Errorf("processes still in cgroup %s after %v: %v", c.Name, limit, pids)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed[pid] = true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// remove deletes the cluster's cgroup tree in every hierarchy, deepest
// first. A cgroup that is already gone is fine.
func (c *cgroups) remove() error {
	var errs []error
	for _, root := range c.Roots {
		var dirs []string
		_ = filepath.WalkDir(c.path(root), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for range 50 { // a cgroup whose last process just died may still be busy
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EBUSY) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
