// Command mkimage writes a container image tarball without a container
// daemon (internal/ociimage): `make images` runs it for kvgate's images.
//
//	mkimage --ref ghcr.io/kvgate/kvgate-epp:0.1.0 --out bin/images/kvgate-epp.tar \
//	  --add bin/static/kvgate:/kvgate:0755 --entrypoint /kvgate,epp --user 65532:65532 --port 9002 ...
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/cliflag"
	"github.com/kvgate/kvgate/internal/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var s ociimage.Spec
	var out, entrypoint string
	var adds, ports, env, labels list
	fs.StringVar(&s.Ref, "ref", "", "image name recorded in the tarball (registry/repository:tag)")
	fs.StringVar(&out, "out", "", "tarball to write")
	fs.Var(&adds, "add", "SRC:DST[:MODE] file to put in the layer (octal mode, default 0644); repeatable")
	fs.StringVar(&entrypoint, "entrypoint", "", "comma-separated entrypoint")
	fs.StringVar(&s.User, "user", "", "uid:gid the container runs as")
	fs.StringVar(&s.WorkingDir, "workdir", "", "working directory")
	fs.Var(&ports, "port", "exposed port (9002 or 9002/tcp); repeatable")
	fs.Var(&env, "env", "KEY=VALUE; repeatable")
	fs.Var(&labels, "label", "KEY=VALUE; repeatable")
	fs.StringVar(&s.Arch, "arch", "", "architecture (default this machine's)")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if s.Ref == "" || out == "" {
		return fmt.Errorf("--ref and --out are required")
	}
	for _, a := range adds {
		parts := strings.Split(a, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--add %q: want SRC:DST[:MODE]", a)
		}
		f := ociimage.File{Src: parts[0], Dst: parts[1]}
		if len(parts) == 3 {
			m, err := strconv.ParseInt(parts[2], 8, 32)
			if err != nil {
				return fmt.Errorf("--add %q: mode: %w", a, err)
			}
			f.Mode = m
		}
		s.Files = append(s.Files, f)
	}
	if entrypoint != "" {
		s.Entrypoint = strings.Split(entrypoint, ",")
	}
	s.ExposedPorts, s.Env = ports, env
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	return ociimage.WriteTarball(out, s)
}
