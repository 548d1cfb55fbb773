package deploy

import (
	"fmt"
	"path"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy/kproxy/pkg/config"
)

// Names the deployment is built around.
const (
	linuxDaemonSet     = "kproxy"
	windowsDaemonSet   = "kproxy-windows"
	proxyContainerName = "kproxy"
	healthzPort        = 10256
	nodeNameEnv        = "NODE_NAME"
)

// invariant is one property a DaemonSet must have, with a way to break it
// (which proves that the check can fail).
type invariant struct {
	name  string
	check func(r *rendered, ds *appsv1.DaemonSet) error
	// breakIt changes ds so that check must fail.
	breakIt func(ds *appsv1.DaemonSet)
}

// sharedPodLabel is on the pods of both OSes' DaemonSets (their selectors
// differ), so that one `kubectl get pod -l` finds every kproxy pod
// (README, docs/troubleshooting.md).
const sharedPodLabel = "app.kubernetes.io/name"

func commonInvariants(os string) []invariant {
	return []invariant{
		{"pods labelled " + sharedPodLabel + "=kproxy, as on the other OS",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				v := ds.Spec.Template.Labels[sharedPodLabel]
				return want(v == "kproxy", "pod label %s=%q, want kproxy", sharedPodLabel, v)
			},
			func(ds *appsv1.DaemonSet) { delete(ds.Spec.Template.Labels, sharedPodLabel) }},
		{"in kube-system",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return want(ds.Namespace == "kube-system", "namespace %q", ds.Namespace)
			},
			func(ds *appsv1.DaemonSet) { ds.Namespace = "default" }},
		{"host network",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return want(ds.Spec.Template.Spec.HostNetwork, "hostNetwork is false")
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.HostNetwork = false }},
		{"only on " + os + " nodes",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				ns := ds.Spec.Template.Spec.NodeSelector
				return want(len(ns) == 1 && ns[v1.LabelOSStable] == os, "nodeSelector %v, want exactly %s: %s", ns, v1.LabelOSStable, os)
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.NodeSelector[v1.LabelOSStable] = "plan9" }},
		{"tolerates every taint",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				for _, tol := range ds.Spec.Template.Spec.Tolerations {
					if tol.Operator == v1.TolerationOpExists && tol.Key == "" && tol.Effect == "" {
						return nil
					}
				}
				return fmt.Errorf("no toleration {operator: Exists} without key and effect: %v", ds.Spec.Template.Spec.Tolerations)
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.Tolerations[0].Effect = v1.TaintEffectNoSchedule }},
		{"system-node-critical",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				pc := ds.Spec.Template.Spec.PriorityClassName
				return want(pc == "system-node-critical", "priorityClassName %q", pc)
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.PriorityClassName = "" }},
		{"rolling update, no surge",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				s := ds.Spec.UpdateStrategy
				if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil {
					return fmt.Errorf("update strategy %+v", s)
				}
				if mu := s.RollingUpdate.MaxUnavailable; mu == nil || isZero(mu) {
					return fmt.Errorf("maxUnavailable %v: the rollout could never proceed", mu)
				}
				// Two kproxy pods on one node would fight over the same rules.
				if ms := s.RollingUpdate.MaxSurge; ms != nil && !isZero(ms) {
					return fmt.Errorf("maxSurge %v, want 0", ms)
				}
				return nil
			},
			func(ds *appsv1.DaemonSet) {
				ms := intstr.FromInt32(1)
				ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge = &ms
			}},
		{"liveness on /livez",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return httpProbe(proxyContainer(ds).LivenessProbe, "/livez")
			},
			func(ds *appsv1.DaemonSet) { proxyContainer(ds).LivenessProbe.HTTPGet.Path = "/healthz" }},
		{"readiness on /healthz",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return httpProbe(proxyContainer(ds).ReadinessProbe, "/healthz")
			},
			func(ds *appsv1.DaemonSet) { proxyContainer(ds).ReadinessProbe.HTTPGet.Port = intstr.FromInt32(10249) }},
		{"node name from the downward API",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				c := proxyContainer(ds)
				if v, _ := flagValue(c, "hostname-override"); v != "$("+nodeNameEnv+")" {
					return fmt.Errorf("--hostname-override=%q, want $(%s)", v, nodeNameEnv)
				}
				for _, e := range c.Env {
					if e.Name == nodeNameEnv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
						return nil
					}
				}
				return fmt.Errorf("no %s environment variable from fieldRef spec.nodeName", nodeNameEnv)
			},
			func(ds *appsv1.DaemonSet) { proxyContainer(ds).Env[0].ValueFrom.FieldRef.FieldPath = "metadata.name" }},
		{"config from the ConfigMap",
			func(r *rendered, ds *appsv1.DaemonSet) error {
				_, key, err := configSource(r, ds)
				if err != nil {
					return err
				}
				return want(key == os+".yaml", "--config is ConfigMap key %q, want %s.yaml", key, os)
			},
			func(ds *appsv1.DaemonSet) {
				for _, vol := range ds.Spec.Template.Spec.Volumes {
					if vol.ConfigMap != nil {
						vol.ConfigMap.Name = "missing"
					}
				}
			}},
		{"service account of the ClusterRoleBinding",
			func(r *rendered, ds *appsv1.DaemonSet) error {
				sa := ds.Spec.Template.Spec.ServiceAccountName
				if _, ok := r.serviceAccounts[sa]; !ok {
					return fmt.Errorf("serviceAccountName %q is not in the kustomization", sa)
				}
				_, err := clusterRoleFor(r, ds.Namespace, sa)
				return err
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.ServiceAccountName = "default" }},
	}
}

func linuxInvariants() []invariant {
	return append(commonInvariants("linux"),
		invariant{"least privilege: NET_ADMIN and NET_RAW only",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				sc := proxyContainer(ds).SecurityContext
				if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
					return fmt.Errorf("privileged or no capabilities: %+v", sc)
				}
				drop := fmt.Sprint(sc.Capabilities.Drop)
				add := fmt.Sprint(sc.Capabilities.Add)
				return want(drop == "[ALL]" && add == "[NET_ADMIN NET_RAW]", "capabilities drop %s add %s, want drop [ALL] add [NET_ADMIN NET_RAW]", drop, add)
			},
			func(ds *appsv1.DaemonSet) {
				sc := proxyContainer(ds).SecurityContext
				sc.Capabilities.Add = append(sc.Capabilities.Add, "SYS_ADMIN")
			}},
		invariant{"a privileged init container runs --init-only with the same config",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				ics := ds.Spec.Template.Spec.InitContainers
				if len(ics) != 1 {
					return fmt.Errorf("%d init containers, want 1", len(ics))
				}
				ic := ics[0]
				if sc := ic.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
					return fmt.Errorf("init container not privileged")
				}
				script := strings.Join(append(append([]string(nil), ic.Command...), ic.Args...), " ")
				cfg, _ := flagValue(proxyContainer(ds), "config")
				if !strings.Contains(script, "--init-only") || cfg == "" || !strings.Contains(script, "--config="+cfg) {
					return fmt.Errorf("init container %q does not run kproxy --init-only --config=%s", script, cfg)
				}
				return want(ic.Image == proxyContainer(ds).Image, "init image %q differs from kproxy's", ic.Image)
			},
			func(ds *appsv1.DaemonSet) { ds.Spec.Template.Spec.InitContainers = nil }},
		invariant{"xtables lock shared with the host",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return hostPathMount(ds, "/run/xtables.lock", v1.HostPathFileOrCreate, false)
			},
			func(ds *appsv1.DaemonSet) { volumeWithHostPath(ds, "/run/xtables.lock").HostPath.Type = nil }},
		invariant{"/lib/modules read-only",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				return hostPathMount(ds, "/lib/modules", "", true)
			},
			func(ds *appsv1.DaemonSet) {
				c := proxyContainer(ds)
				for i := range c.VolumeMounts {
					c.VolumeMounts[i].ReadOnly = false
				}
			}},
	)
}

func windowsInvariants() []invariant {
	return append(commonInvariants("windows"),
		invariant{"HostProcess as SYSTEM",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				sc := ds.Spec.Template.Spec.SecurityContext
				if sc == nil || sc.WindowsOptions == nil {
					return fmt.Errorf("no pod securityContext.windowsOptions")
				}
				w := sc.WindowsOptions
				if w.HostProcess == nil || !*w.HostProcess {
					return fmt.Errorf("hostProcess is not true")
				}
				return want(w.RunAsUserName != nil && *w.RunAsUserName == `NT AUTHORITY\system`, "runAsUserName %v", w.RunAsUserName)
			},
			func(ds *appsv1.DaemonSet) {
				u := `NT AUTHORITY\SYSTEM32`
				ds.Spec.Template.Spec.SecurityContext.WindowsOptions.RunAsUserName = &u
			}},
		invariant{"kernelspace mode",
			func(r *rendered, ds *appsv1.DaemonSet) error {
				// With --config, --proxy-mode is ignored (as upstream): the
				// file sets the mode, and a contradicting flag would mislead.
				if v, ok := flagValue(proxyContainer(ds), "proxy-mode"); ok && v != "kernelspace" {
					return fmt.Errorf("--proxy-mode=%q", v)
				}
				cm, key, err := configSource(r, ds)
				if err != nil {
					return err
				}
				c, err := config.Decode([]byte(cm.Data[key]))
				if err != nil {
					return err
				}
				return want(c.Mode == config.ModeKernelspace, "config mode %q", c.Mode)
			},
			func(ds *appsv1.DaemonSet) {
				c := proxyContainer(ds)
				c.Args = append(c.Args, "--proxy-mode=iptables")
			}},
		invariant{"no hard-coded HNS network: the ConfigMap's winkernel.networkName, else the node's only usable network",
			func(_ *rendered, ds *appsv1.DaemonSet) error {
				for _, e := range proxyContainer(ds).Env {
					if e.Name == "KUBE_NETWORK" {
						return want(false, "KUBE_NETWORK is set in the DaemonSet (%q): the network differs per CNI and belongs in the ConfigMap", e.Value)
					}
				}
				return nil
			},
			func(ds *appsv1.DaemonSet) {
				c := proxyContainer(ds)
				c.Env = append(c.Env, v1.EnvVar{Name: "KUBE_NETWORK", Value: "flannel.4096"})
			}},
	)
}

func TestDaemonSetInvariants(t *testing.T) {
	r := renderMain(t)
	for _, tc := range []struct {
		name       string
		invariants []invariant
	}{
		{linuxDaemonSet, linuxInvariants()},
		{windowsDaemonSet, windowsInvariants()},
	} {
		ds := r.daemonSet(t, tc.name)
		for _, inv := range tc.invariants {
			t.Run(tc.name+"/"+inv.name, func(t *testing.T) {
				if err := inv.check(r, ds); err != nil {
					t.Errorf("DaemonSet %s: %v", tc.name, err)
				}
				broken := ds.DeepCopy()
				inv.breakIt(broken)
				if err := inv.check(r, broken); err == nil {
					t.Errorf("the check passes on a DaemonSet that breaks it")
				}
			})
		}
	}
	if n := len(r.daemonSets); n != 2 {
		t.Errorf("%d DaemonSets rendered, want 2 (Linux, Windows)", n)
	}
}

// TestCleanupDaemonSets checks the rollback helpers: they run kproxy
// --cleanup with the same node access as kproxy, on every node of their OS.
func TestCleanupDaemonSets(t *testing.T) {
	r := renderDir(t, "cleanup")
	main := renderMain(t)
	seen := map[string]bool{}
	if len(r.objs) != len(r.daemonSets)+len(r.configMaps) || len(r.configMaps) != 1 {
		t.Errorf("%d objects, want the DaemonSets and one ConfigMap (%d)", len(r.objs), len(r.configMaps))
	}
	for name := range r.configMaps {
		if main.configMaps[name] != nil {
			t.Errorf("ConfigMap %s is also kproxy's: deleting the cleanup would delete it", name)
		}
	}
	for _, ds := range r.daemonSets {
		spec := &ds.Spec.Template.Spec
		os := spec.NodeSelector[v1.LabelOSStable]
		seen[os] = true
		if len(spec.InitContainers) != 1 {
			t.Fatalf("%s: %d init containers, want 1 (kproxy --cleanup)", ds.Name, len(spec.InitContainers))
		}
		c := &spec.InitContainers[0]
		if !hasFlag(c, "cleanup") {
			t.Errorf("%s: init container args %v lack --cleanup", ds.Name, c.Args)
		}
		if !spec.HostNetwork {
			t.Errorf("%s: not on the host network", ds.Name)
		}
		switch os {
		case "linux":
			// It runs next to the kube-proxy being rolled back to: it must
			// not remove kube-proxy's state.
			if v, ok := flagValue(c, "take-over-kube-proxy"); !ok || v != "false" {
				t.Errorf("%s: --take-over-kube-proxy=%q (set %v), want false", ds.Name, v, ok)
			}
			if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
				t.Errorf("%s: not privileged", ds.Name)
			}
			if err := hostPathMountOf(spec, c, "/run/xtables.lock", v1.HostPathFileOrCreate, false); err != nil {
				t.Errorf("%s: %v", ds.Name, err)
			}
		case "windows":
			if w := spec.SecurityContext; w == nil || w.WindowsOptions == nil || w.WindowsOptions.HostProcess == nil || !*w.WindowsOptions.HostProcess {
				t.Errorf("%s: not a HostProcess pod", ds.Name)
			}
			// kproxy's configuration, from the same file as kproxy's: the
			// cleanup works on the HNS network kproxy used (on a host with
			// several networks, auto-detection finds none and only load
			// balancers would be deleted, leaving kproxy's endpoints).
			cm, key, err := configSourceOf(r, ds, c)
			if err != nil {
				t.Fatalf("%s: %v", ds.Name, err)
			}
			mainCM, mainKey, err := configSource(main, main.daemonSet(t, windowsDaemonSet))
			if err != nil {
				t.Fatal(err)
			}
			if key != mainKey || cm.Data[key] != mainCM.Data[mainKey] {
				t.Errorf("%s: --config is ConfigMap %s key %q, not the configuration kproxy-windows runs with (%s key %q)", ds.Name, cm.Name, key, mainCM.Name, mainKey)
			}
			o := containerOptions(t, r, ds, c)
			if o.ProxyMode() != config.ModeKernelspace || !o.Cleanup || o.NodeName != testNodeName {
				t.Errorf("%s: mode %q, cleanup %v, node %q", ds.Name, o.ProxyMode(), o.Cleanup, o.NodeName)
			}
			if w := o.Warnings(); len(w) > 0 {
				t.Errorf("%s: the arguments set what kproxy ignores with --config: %q", ds.Name, w)
			}
			for _, e := range c.Env {
				if e.Name == "KUBE_NETWORK" {
					t.Errorf("%s: KUBE_NETWORK is set (%q): the network belongs in the ConfigMap", ds.Name, e.Value)
				}
			}
		default:
			t.Errorf("%s: nodeSelector %v", ds.Name, spec.NodeSelector)
		}
	}
	if !seen["linux"] || !seen["windows"] {
		t.Errorf("cleanup DaemonSets for %v, want linux and windows", seen)
	}
}

func isZero(v *intstr.IntOrString) bool { return v.String() == "0" || v.String() == "0%" }

func want(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// proxy returns the kproxy container (a zero one if missing, which fails
// every check that looks at it).
func proxyContainer(ds *appsv1.DaemonSet) *v1.Container {
	cs := ds.Spec.Template.Spec.Containers
	for i := range cs {
		if cs[i].Name == proxyContainerName {
			return &cs[i]
		}
	}
	return &v1.Container{}
}

func httpProbe(p *v1.Probe, path string) error {
	if p == nil || p.HTTPGet == nil {
		return fmt.Errorf("no HTTP probe")
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != healthzPort {
		return fmt.Errorf("probe %s:%s, want %s:%d", p.HTTPGet.Path, p.HTTPGet.Port.String(), path, healthzPort)
	}
	if p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != v1.URISchemeHTTP {
		return fmt.Errorf("probe scheme %s", p.HTTPGet.Scheme)
	}
	return nil
}

// flagValue returns the value of --name=value among the container's args.
func flagValue(c *v1.Container, name string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func hasFlag(c *v1.Container, name string) bool {
	for _, a := range c.Args {
		if a == "--"+name || a == "--"+name+"=true" {
			return true
		}
	}
	return false
}

func setFlag(c *v1.Container, name, value string) {
	for i, a := range c.Args {
		if strings.HasPrefix(a, "--"+name+"=") {
			c.Args[i] = "--" + name + "=" + value
		}
	}
}

func envValue(c *v1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func volumeWithHostPath(ds *appsv1.DaemonSet, p string) *v1.Volume {
	vs := ds.Spec.Template.Spec.Volumes
	for i := range vs {
		if vs[i].HostPath != nil && vs[i].HostPath.Path == p {
			return &vs[i]
		}
	}
	return &v1.Volume{}
}

// hostPathMount checks that the kproxy container mounts host path p at the
// same path, with the given hostPath type ("" for none) and read-only flag.
func hostPathMount(ds *appsv1.DaemonSet, p string, typ v1.HostPathType, readOnly bool) error {
	return hostPathMountOf(&ds.Spec.Template.Spec, proxyContainer(ds), p, typ, readOnly)
}

func hostPathMountOf(spec *v1.PodSpec, c *v1.Container, p string, typ v1.HostPathType, readOnly bool) error {
	var vol *v1.Volume
	for i := range spec.Volumes {
		if hp := spec.Volumes[i].HostPath; hp != nil && hp.Path == p {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil {
		return fmt.Errorf("no hostPath volume %s", p)
	}
	if got := vol.HostPath.Type; (typ == "" && got != nil && *got != "") || (typ != "" && (got == nil || *got != typ)) {
		return fmt.Errorf("hostPath %s: type %v, want %q", p, got, typ)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == vol.Name {
			if m.MountPath != p || m.ReadOnly != readOnly || m.SubPath != "" {
				return fmt.Errorf("hostPath %s mounted at %s (readOnly %v), want %s (readOnly %v)", p, m.MountPath, m.ReadOnly, p, readOnly)
			}
			return nil
		}
	}
	return fmt.Errorf("container %s does not mount hostPath %s", c.Name, p)
}

// configSource follows --config to the ConfigMap key it is mounted from.
func configSource(r *rendered, ds *appsv1.DaemonSet) (cm *v1.ConfigMap, key string, err error) {
	return configSourceOf(r, ds, proxyContainer(ds))
}

// configSourceOf is configSource for container c of ds.
func configSourceOf(r *rendered, ds *appsv1.DaemonSet, c *v1.Container) (cm *v1.ConfigMap, key string, err error) {
	file, ok := flagValue(c, "config")
	if !ok {
		return nil, "", fmt.Errorf("no --config flag")
	}
	return mountedKey(r, ds, c, file)
}

// mountedKey finds the ConfigMap and key mounted at file in container c.
func mountedKey(r *rendered, ds *appsv1.DaemonSet, c *v1.Container, file string) (*v1.ConfigMap, string, error) {
	dir, base := path.Split(file)
	dir = strings.TrimSuffix(dir, "/")
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, vol := range ds.Spec.Template.Spec.Volumes {
			if vol.Name != m.Name || vol.ConfigMap == nil {
				continue
			}
			cm, ok := r.configMaps[vol.ConfigMap.Name]
			if !ok {
				return nil, "", fmt.Errorf("%s: volume %s names ConfigMap %q, which is not in the kustomization", file, vol.Name, vol.ConfigMap.Name)
			}
			for _, it := range vol.ConfigMap.Items {
				if it.Path == base {
					if _, ok := cm.Data[it.Key]; !ok {
						return nil, "", fmt.Errorf("%s: ConfigMap %s has no key %q", file, cm.Name, it.Key)
					}
					return cm, it.Key, nil
				}
			}
			return nil, "", fmt.Errorf("%s: volume %s has no item with path %s", file, vol.Name, base)
		}
	}
	return nil, "", fmt.Errorf("%s: no ConfigMap volume is mounted at %s", file, dir)
}
