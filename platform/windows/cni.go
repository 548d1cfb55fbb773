package windows

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// EnvCNIConfDir overrides the directories kproxy reads the node's CNI
// network configuration from (DefaultCNIConfDirs).
const EnvCNIConfDir = "KPROXY_CNI_CONF_DIR"

// DefaultCNIConfDirs are where Windows nodes keep their CNI network
// configuration: sig-windows-tools' and most guides' C:\etc\cni\net.d,
// containerd's default on Windows, and the Linux path (a relative path is
// on the system drive).
var DefaultCNIConfDirs = []string{`C:\etc\cni\net.d`, `C:\Program Files\containerd\cni\conf`, "/etc/cni/net.d"}

// CNIConfig is what kproxy takes from the node's CNI network configuration:
// the file the runtime uses (the first in name order, as CNI's libcni
// picks it), its network name, and its IPAM.
type CNIConfig struct {
	// File is the configuration file read.
	File string
	// Name is the network's name: win-bridge and win-overlay name their HNS
	// network by it, and host-local keys its store by it
	// (<dataDir>/<Name>).
	Name string
	// Plugin is the main plugin's type (for flannel, "flannel" delegating
	// to Delegate).
	Plugin, Delegate string
	// IPAM is the IPAM plugin's type ("host-local", "calico-ipam", ...;
	// empty when none is named).
	IPAM string
	// DataDir is host-local's data directory (DefaultIPAMDataDir when the
	// configuration names none).
	DataDir string
}

// HostLocal reports whether the network's addresses come from host-local.
func (c *CNIConfig) HostLocal() bool { return c != nil && c.IPAM == "host-local" }

// Store is host-local's store of the network: DataDir/Name.
func (c *CNIConfig) Store() string { return filepath.Join(c.DataDir, c.Name) }

// ErrNoCNIConfig is returned (wrapped) when no CNI configuration file is found.
var ErrNoCNIConfig = errors.New("no CNI network configuration")

// ReadCNIConfig returns the CNI configuration the runtime uses: the first
// .conflist, .conf or .json file, in name order, of the first of dirs that
// has one.
func ReadCNIConfig(dirs []string) (*CNIConfig, error) {
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading CNI configuration directory %s: %w", dir, err)
		}
		var names []string
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".conflist", ".conf", ".json":
				if e.Type().IsRegular() {
					names = append(names, e.Name())
				}
			}
		}
		sort.Strings(names)
		for _, n := range names {
			path := filepath.Join(dir, n)
			data, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("reading CNI configuration %s: %w", path, err)
			}
			c, err := ParseCNIConfig(data)
			if err != nil {
				return nil, fmt.Errorf("CNI configuration %s: %w", path, err)
			}
			c.File = path
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w in %s", ErrNoCNIConfig, strings.Join(dirs, ", "))
}

// cniPlugin is the part of a CNI plugin configuration kproxy reads.
type cniPlugin struct {
	Type     string          `json:"type"`
	Delegate json.RawMessage `json:"delegate"`
	IPAM     *struct {
		Type    string `json:"type"`
		DataDir string `json:"dataDir"`
	} `json:"ipam"`
}

// ParseCNIConfig reads a network configuration list (.conflist) or a single
// network configuration (.conf). flannel's delegate (its "delegate" object)
// is looked into for the plugin and the IPAM; flannel's own plugin uses
// host-local (with the conflist's name) when the delegate names none.
func ParseCNIConfig(data []byte) (*CNIConfig, error) {
	var top struct {
		Name    string      `json:"name"`
		Plugins []cniPlugin `json:"plugins"`
		cniPlugin
	}
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	if top.Name == "" {
		return nil, errors.New("no network name")
	}
	main := top.cniPlugin
	if len(top.Plugins) > 0 {
		main = top.Plugins[0]
	}
	c := &CNIConfig{Name: top.Name, Plugin: main.Type, DataDir: DefaultIPAMDataDir}
	ipam := main.IPAM
	if len(main.Delegate) > 0 {
		var d cniPlugin
		if err := json.Unmarshal(main.Delegate, &d); err != nil {
			return nil, fmt.Errorf("parsing the delegate: %w", err)
		}
		c.Delegate = d.Type
		if d.IPAM != nil {
			ipam = d.IPAM
		}
	}
	switch {
	case ipam != nil:
		c.IPAM = ipam.Type
		if ipam.DataDir != "" {
			c.DataDir = ipam.DataDir
		}
	case main.Type == "flannel":
		c.IPAM = "host-local" // flannel's plugin hands its delegate host-local
	}
	return c, nil
}
