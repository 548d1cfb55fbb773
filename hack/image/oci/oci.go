package oci

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// Media types and annotations of the OCI image specification (v1.1) that
// this package writes.
const (
	MediaTypeIndex     = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest  = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig    = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip"
	// AnnotationRefName names an image of a layout (its tag); podman load,
	// skopeo and ctr image import read it.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationCreated and AnnotationVersion are the standard annotation
	// keys, used here as config labels too.
	AnnotationCreated = "org.opencontainers.image.created"
	AnnotationVersion = "org.opencontainers.image.version"
)

// Descriptor points at a blob.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Config is the image configuration blob.
type Config struct {
	Created      string          `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       ContainerConfig `json:"config"`
	RootFS       RootFS          `json:"rootfs"`
}

// ContainerConfig is the part of Config a runtime uses to start the container.
type ContainerConfig struct {
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// RootFS lists the layers' uncompressed digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// Image describes the image WriteArchive writes.
type Image struct {
	// Ref is the tag, written as the org.opencontainers.image.ref.name
	// annotation of the index's manifest descriptor (required).
	Ref string
	// Annotations are added to the index's manifest descriptor (e.g.
	// io.containerd.image.name, which ctr image import names the image by).
	Annotations  map[string]string
	OS           string // "linux"
	Architecture string // GOARCH spelling: "amd64", "arm64"
	Entrypoint   []string
	Cmd          []string
	Env          []string
	Labels       map[string]string
	// Created is the config's created time (SOURCE_DATE_EPOCH).
	Created time.Time
	Layers  []Layer
}

// Layer is one gzipped layer blob and its uncompressed digest.
type Layer struct {
	Blob   []byte
	DiffID string
}

// Digest returns the "sha256:<hex>" digest of data.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Result is what WriteArchive wrote.
type Result struct {
	// Manifest is the manifest's descriptor (its digest is the image's
	// digest, what a registry reports after a push).
	Manifest Descriptor
	Config   Config
}

// WriteArchive writes img as an OCI image layout in a tar archive
// (oci-layout, index.json, blobs/sha256/...), entries sorted, each with
// mode 0644 (directories 0755), uid/gid 0 and img.Created as mtime.
func WriteArchive(w io.Writer, img Image) (Result, error) {
	if img.Ref == "" || img.OS == "" || img.Architecture == "" {
		return Result{}, errors.New("oci: image needs a ref, an OS and an architecture")
	}
	if len(img.Layers) == 0 {
		return Result{}, errors.New("oci: image has no layer")
	}
	created := img.Created.UTC().Truncate(time.Second)
	cfg := Config{
		Created:      created.Format(time.RFC3339),
		Architecture: img.Architecture,
		OS:           img.OS,
		Config: ContainerConfig{
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			Env:        img.Env,
			Labels:     img.Labels,
		},
		RootFS: RootFS{Type: "layers"},
	}
	blobs := map[string][]byte{}
	man := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest}
	for _, l := range img.Layers {
		d := Digest(l.Blob)
		blobs[d] = l.Blob
		man.Layers = append(man.Layers, Descriptor{MediaType: MediaTypeLayerGzip, Digest: d, Size: int64(len(l.Blob))})
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return Result{}, fmt.Errorf("oci: config: %w", err)
	}
	man.Config = Descriptor{MediaType: MediaTypeConfig, Digest: Digest(cfgJSON), Size: int64(len(cfgJSON))}
	blobs[man.Config.Digest] = cfgJSON
	manJSON, err := json.Marshal(man)
	if err != nil {
		return Result{}, fmt.Errorf("oci: manifest: %w", err)
	}
	manDesc := Descriptor{
		MediaType:   MediaTypeManifest,
		Digest:      Digest(manJSON),
		Size:        int64(len(manJSON)),
		Annotations: map[string]string{AnnotationRefName: img.Ref},
		Platform:    &Platform{Architecture: img.Architecture, OS: img.OS},
	}
	for k, v := range img.Annotations {
		manDesc.Annotations[k] = v
	}
	blobs[manDesc.Digest] = manJSON
	idxJSON, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{manDesc}})
	if err != nil {
		return Result{}, fmt.Errorf("oci: index: %w", err)
	}

	tw := tar.NewWriter(w)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: created, Format: tar.FormatPAX})
	}
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	err = errors.Join(
		dir("blobs/"),
		dir("blobs/sha256/"),
	)
	for _, d := range digests {
		if err != nil {
			break
		}
		err = file("blobs/sha256/"+d[len("sha256:"):], blobs[d])
	}
	if err == nil {
		err = errors.Join(
			file("index.json", idxJSON),
			file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)),
			tw.Close(),
		)
	}
	if err != nil {
		return Result{}, fmt.Errorf("oci: write archive: %w", err)
	}
	return Result{Manifest: manDesc, Config: cfg}, nil
}

// ReadArchive reads an OCI archive written by WriteArchive (or any layout
// with one image manifest in its index), checks the digest and size of
// every blob it uses, and returns the manifest, the config and the layers'
// blobs (compressed, in order).
func ReadArchive(r io.Reader) (Descriptor, Config, [][]byte, error) {
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Descriptor{}, Config{}, nil, fmt.Errorf("oci: read archive: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		var b bytes.Buffer
		if _, err := io.Copy(&b, tr); err != nil {
			return Descriptor{}, Config{}, nil, fmt.Errorf("oci: read archive %s: %w", h.Name, err)
		}
		files[h.Name] = b.Bytes()
	}
	if _, ok := files["oci-layout"]; !ok {
		return Descriptor{}, Config{}, nil, errors.New("oci: archive has no oci-layout file")
	}
	var idx Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		return Descriptor{}, Config{}, nil, fmt.Errorf("oci: index.json: %w", err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != MediaTypeManifest {
		return Descriptor{}, Config{}, nil, fmt.Errorf("oci: index.json lists %d manifests, want one image manifest", len(idx.Manifests))
	}
	blob := func(d Descriptor) ([]byte, error) {
		if len(d.Digest) <= len("sha256:") || d.Digest[:len("sha256:")] != "sha256:" {
			return nil, fmt.Errorf("oci: unsupported digest %q", d.Digest)
		}
		data, ok := files["blobs/sha256/"+d.Digest[len("sha256:"):]]
		if !ok {
			return nil, fmt.Errorf("oci: blob %s missing", d.Digest)
		}
		if got := Digest(data); got != d.Digest || int64(len(data)) != d.Size {
			return nil, fmt.Errorf("oci: blob %s: digest %s, size %d (descriptor: %d)", d.Digest, got, len(data), d.Size)
		}
		return data, nil
	}
	manDesc := idx.Manifests[0]
	manJSON, err := blob(manDesc)
	if err != nil {
		return Descriptor{}, Config{}, nil, err
	}
	var man Manifest
	if err := json.Unmarshal(manJSON, &man); err != nil {
		return Descriptor{}, Config{}, nil, fmt.Errorf("oci: manifest: %w", err)
	}
	cfgJSON, err := blob(man.Config)
	if err != nil {
		return Descriptor{}, Config{}, nil, err
	}
	var cfg Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return Descriptor{}, Config{}, nil, fmt.Errorf("oci: config: %w", err)
	}
	if len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return Descriptor{}, Config{}, nil, fmt.Errorf("oci: %d layers but %d diff_ids", len(man.Layers), len(cfg.RootFS.DiffIDs))
	}
	var layers [][]byte
	for _, l := range man.Layers {
		if l.MediaType != MediaTypeLayerGzip {
			return Descriptor{}, Config{}, nil, fmt.Errorf("oci: layer %s: unsupported media type %s", l.Digest, l.MediaType)
		}
		data, err := blob(l)
		if err != nil {
			return Descriptor{}, Config{}, nil, err
		}
		layers = append(layers, data)
	}
	return manDesc, cfg, layers, nil
}
