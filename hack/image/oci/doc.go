// Package oci writes and reads OCI image layouts as tar archives
// (oci-archive), deterministically: a layer is built from a directory with
// its entries sorted, owned by uid/gid 0, without access or change times and
// with modification times clamped to an epoch (SOURCE_DATE_EPOCH), and
// gzipped without a name or time in the gzip header; the config's created
// time is the epoch. The same directory, image description and epoch give
// the same bytes, hence the same digests, on every build.
//
// It is what make images assembles the Linux image with (see
// hack/image/cmd/kproxy-image), without a container engine or registry.
// The package is pure Go and builds on every OS.
package oci
