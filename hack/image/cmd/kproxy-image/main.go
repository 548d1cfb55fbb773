// Command kproxy-image builds kproxy's Linux image as an OCI archive, offline
// from Debian's packages (see package image); make images runs it:
//
//	kproxy-image -kproxy BIN -version VERSION -epoch SOURCE_DATE_EPOCH -out FILE.oci.tar
//
// It prints the image's digest. Two runs with the same binary, package
// versions and epoch write the same bytes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/hack/image"
	"github.com/kproxy/kproxy/hack/image/oci"
)

func main() {
	var (
		bin     = flag.String("kproxy", "", "the kproxy binary (linux) to put at /usr/local/bin/kproxy")
		version = flag.String("version", "dev", "the image's tag and version label (git describe)")
		epoch   = flag.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "SOURCE_DATE_EPOCH: seconds since 1970, the image's created time and the files' latest mtime")
		out     = flag.String("out", "", "the OCI archive to write")
		cache   = flag.String("cache", ".build/images/debs", "where the .debs are downloaded (kept between builds)")
		name    = flag.String("name", "ghcr.io/kproxy/kproxy", "the image name for io.containerd.image.name (NAME:VERSION), as deploy/images names it")
		arch    = flag.String("arch", "amd64", "the image's architecture (that of the binary and of the packages apt-get resolves)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*bin, *version, *epoch, *out, *cache, *name, *arch); err != nil {
		klog.ErrorS(err, "Building the image failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run(bin, version, epochStr, out, cache, name, arch string) error {
	if bin == "" || out == "" {
		return fmt.Errorf("-kproxy and -out are required")
	}
	sec, err := strconv.ParseInt(epochStr, 10, 64)
	if err != nil {
		return fmt.Errorf("-epoch %q (SOURCE_DATE_EPOCH): %w", epochStr, err)
	}
	epoch := time.Unix(sec, 0).UTC()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()

	pkgs, err := image.Resolve(ctx, cache, image.Packages)
	if err != nil {
		return err
	}
	for _, p := range pkgs {
		if p.Arch != arch && p.Arch != "all" {
			return fmt.Errorf("apt-get resolved %s for %s, the image is %s (pass -arch %s, or build on a %s machine)", p.Name, p.Arch, arch, p.Arch, arch)
		}
	}
	debs, err := image.Download(ctx, cache, pkgs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(out), ".rootfs-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(work) }()
	root := filepath.Join(work, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	if err := image.Unpack(ctx, root, debs); err != nil {
		return err
	}
	if err := addKproxy(root, bin, pkgs); err != nil {
		return err
	}
	if err := image.CheckTools(root, image.Tools()); err != nil {
		return fmt.Errorf("the root filesystem lacks tools kproxy runs: %w", err)
	}
	layer, err := oci.BuildLayer(root, epoch)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	res, err := oci.WriteArchive(&buf, oci.Image{
		Ref:          version,
		Annotations:  map[string]string{"io.containerd.image.name": name + ":" + version},
		OS:           "linux",
		Architecture: arch,
		Entrypoint:   []string{"/usr/local/bin/kproxy"},
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			oci.AnnotationVersion:             version,
			oci.AnnotationCreated:             epoch.Format(time.RFC3339),
			"org.opencontainers.image.title":  "kproxy",
			"org.opencontainers.image.source": "deploy/linux (make images)",
		},
		Created: epoch,
		Layers:  []oci.Layer{layer},
	})
	if err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Printf("%s: %s:%s (%d packages, layer %.1f MB compressed, archive %.1f MB) in %v\n",
		out, name, version, len(pkgs), float64(len(layer.Blob))/1e6, float64(buf.Len())/1e6, time.Since(start).Round(100*time.Millisecond))
	fmt.Printf("digest %s\n", res.Manifest.Digest)
	return nil
}

// addKproxy puts the binary at /usr/local/bin/kproxy, kube-proxy's path as
// a link to it (an existing kube-proxy DaemonSet then runs kproxy with only
// its image swapped), and the package list at
// /usr/share/kproxy-image/packages.
func addKproxy(root, bin string, pkgs []image.Pkg) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("kproxy binary: %w", err)
	}
	dir := filepath.Join(root, "usr/local/bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kproxy"), data, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("kproxy", filepath.Join(dir, "kube-proxy")); err != nil {
		return err
	}
	var list strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&list, "%s %s %s\n", p.Name, p.Version, p.Arch)
	}
	doc := filepath.Join(root, "usr/share/kproxy-image")
	if err := os.MkdirAll(doc, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(doc, "packages"), []byte(list.String()), 0o644)
}
