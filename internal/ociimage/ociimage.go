package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image's layer.
type File struct {
	Src  string // path on this machine
	Dst  string // absolute path in the image
	Mode int64  // permission bits
}

// Spec describes an image.
type Spec struct {
	// Ref is the name the tarball records, e.g. ghcr.io/kvgate/kvgate-epp:0.1.0.
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	// User is "uid:gid"; a numeric non-root user needs no /etc/passwd.
	User         string
	ExposedPorts []string // "9002/tcp"
	WorkingDir   string
	Env          []string
	Labels       map[string]string
	// OS and Arch default to this machine's GOOS / GOARCH.
	OS, Arch string
}

// epoch is every timestamp in the image, so that one binary always gives
// the same image digest.
var epoch = time.Unix(0, 0).UTC()

// Build assembles the image.
func Build(s Spec) (v1.Image, error) {
	if len(s.Files) == 0 {
		return nil, errors.New("an image needs at least one file")
	}
	layerTar, err := layerBytes(s.Files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "kvgate mkimage", Comment: "static binary on an empty base",
	}})
	if err != nil {
		return nil, fmt.Errorf("appending layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = orDefault(s.OS, runtime.GOOS), orDefault(s.Arch, runtime.GOARCH)
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint, cf.Config.Cmd = s.Entrypoint, s.Cmd
	cf.Config.User, cf.Config.WorkingDir = s.User, s.WorkingDir
	cf.Config.Env = s.Env
	cf.Config.Labels = s.Labels
	if len(s.ExposedPorts) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range s.ExposedPorts {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	return mutate.ConfigFile(img, cf)
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// layerBytes is the layer's tar: each file with its parent directories,
// owned by root, dated at the epoch, in path order.
func layerBytes(files []File) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Dst < sorted[j].Dst })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range sorted {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst {
			return nil, fmt.Errorf("image path %q: want a clean absolute path", f.Dst)
		}
		var parents []string
		for d := path.Dir(f.Dst); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("image file: %w", err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTarball builds the image of s and writes it to file as an OCI
// image layout (oci-layout, index.json, blobs/) in a tar, with Docker's
// manifest.json beside it as `docker save` writes since Docker 25: the
// one file loads with docker, podman (oci-archive:), skopeo and crane.
func WriteTarball(file string, s Spec) error {
	ref, err := name.ParseReference(s.Ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", s.Ref, err)
	}
	img, err := Build(s)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout: %w", err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.Name(),
		"io.containerd.image.name":          ref.Name(),
	})); err != nil {
		return fmt.Errorf("image layout: %w", err)
	}
	dm, err := dockerManifest(img, ref.Name())
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), dm, 0o644); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarDir(tmp, dir); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return os.Rename(tmp, file)
}

// dockerManifest is the manifest.json of `docker save`: config and layers
// by their path in the archive.
func dockerManifest(img v1.Image, ref string) ([]byte, error) {
	cfg, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	entry := tarball.Descriptor{Config: "blobs/sha256/" + cfg.Hex, RepoTags: []string{ref}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		entry.Layers = append(entry.Layers, "blobs/sha256/"+d.Hex)
	}
	return json.Marshal(tarball.Manifest{entry})
}

// tarDir writes dir's files into a tar at file, in path order, dated at
// the epoch.
func tarDir(file, dir string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o755, ModTime: epoch})
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Read loads the image of an archive WriteTarball wrote through its OCI
// layout (index.json), so that the manifest read back is the one a push
// sends. The archive is unpacked into workDir, which must outlive the
// image (its blobs are read lazily).
func Read(file, workDir string) (v1.Image, error) {
	if err := untar(file, workDir); err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(workDir)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout: %w", file, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d images in index.json, want 1", file, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// RefName is the name index.json records for the archive's image.
func RefName(file string) (string, error) {
	data, err := readMember(file, "index.json")
	if err != nil {
		return "", err
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(data, &idx); err != nil {
		return "", err
	}
	if len(idx.Manifests) != 1 {
		return "", fmt.Errorf("%s: %d images, want 1", file, len(idx.Manifests))
	}
	return idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"], nil
}

func readMember(file, member string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s has no %s", file, member)
		}
		if err != nil {
			return nil, err
		}
		if h.Name == member {
			return io.ReadAll(tr)
		}
	}
}

func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("%s: entry %q leaves the archive", file, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return err
			}
		}
	}
}

// Extract returns the bytes of the file at dst in img's layers (the
// topmost wins).
func Extract(img v1.Image, dst string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	want := strings.TrimPrefix(dst, "/")
	for i := len(layers) - 1; i >= 0; i-- {
		rc, err := layers[i].Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			if strings.TrimPrefix(h.Name, "./") == want && h.Typeflag == tar.TypeReg {
				data, err := io.ReadAll(tr)
				rc.Close()
				return data, err
			}
		}
		rc.Close()
	}
	return nil, fmt.Errorf("%s not in the image", dst)
}
