// Package ociimage builds container images without a container daemon:
// files laid into one layer on an empty base (no image is pulled), an
// image configuration (entrypoint, user, exposed ports, labels), OCI media
// types, written as an image tarball that `docker load`, `podman load`,
// `kind load image-archive` and `crane push` take. kvgate's binary is
// static (CGO_ENABLED=0), so nothing else needs to be in the image.
package ociimage
