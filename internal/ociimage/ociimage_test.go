package ociimage

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// A static program built here goes into an image; the tarball read back
// has the configuration given, and the binary extracted from its layer
// runs.
func TestBuildReadRun(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from the image\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	build := exec.Command("go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tarFile := filepath.Join(dir, "hello.tar")
	spec := Spec{
		Ref:          "example.com/kvgate/hello:1.0",
		Files:        []File{{Src: bin, Dst: "/bin/hello", Mode: 0o755}, {Src: src, Dst: "/src/main.go"}},
		Entrypoint:   []string{"/bin/hello"},
		User:         "65532:65532",
		ExposedPorts: []string{"9002", "9090/tcp"},
		Labels:       map[string]string{"org.opencontainers.image.source": "kvgate"},
	}
	if err := WriteTarball(tarFile, spec); err != nil {
		t.Fatal(err)
	}
	img, err := Read(tarFile, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/bin/hello"}) || c.User != "65532:65532" || len(c.ExposedPorts) != 2 {
		t.Errorf("config = %+v", c)
	}
	if _, ok := c.ExposedPorts["9002/tcp"]; !ok {
		t.Errorf("ports = %v", c.ExposedPorts)
	}
	if mt, _ := img.MediaType(); mt != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("manifest media type = %s", mt)
	}
	if ref, err := RefName(tarFile); err != nil || ref != "example.com/kvgate/hello:1.0" {
		t.Errorf("ref name = %q, %v", ref, err)
	}
	// Docker's loader reads manifest.json of the same archive.
	dimg, err := tarball.ImageFromPath(tarFile, nil)
	if err != nil {
		t.Fatalf("docker-save view: %v", err)
	}
	if dcf, err := dimg.ConfigFile(); err != nil || dcf.Config.User != "65532:65532" {
		t.Errorf("docker-save view config = %+v, %v", dcf, err)
	}
	// Same inputs, same image.
	again := filepath.Join(dir, "again.tar")
	if err := WriteTarball(again, spec); err != nil {
		t.Fatal(err)
	}
	img2, err := Read(again, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("rebuild changed the digest: %s vs %s", d1, d2)
	}

	data, err := Extract(img, "/bin/hello")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "extracted")
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command(out).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte("hello from the image\n")) {
		t.Errorf("extracted binary printed %q", got)
	}
	if _, err := Extract(img, "/bin/missing"); err == nil {
		t.Error("a missing file was found")
	}
}

func TestBuildErrors(t *testing.T) {
	if _, err := Build(Spec{Ref: "x"}); err == nil {
		t.Error("an image without files was built")
	}
	if _, err := Build(Spec{Files: []File{{Src: "/etc/hostname", Dst: "relative"}}}); err == nil {
		t.Error("a relative image path was accepted")
	}
	if err := WriteTarball(filepath.Join(t.TempDir(), "x.tar"), Spec{Ref: "Bad Name", Files: []File{{Src: "/etc/hostname", Dst: "/x"}}}); err == nil {
		t.Error("a bad image name was accepted")
	}
}
