package config

import (
	"fmt"
	"os"

	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// WriteFile writes c as a kubeproxy.config.k8s.io/v1alpha1 YAML document
// to path (--write-config-to): a file kproxy and kube-proxy both read.
func WriteFile(path string, c *v1alpha1.KubeProxyConfiguration) error {
	out := c.DeepCopy()
	out.APIVersion, out.Kind = kubeProxyConfigAPIVersion, kubeProxyConfigKind
	data, err := yaml.Marshal(out)
	if err != nil {
		return fmt.Errorf("encoding the configuration: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing the configuration: %w", err)
	}
	return nil
}
