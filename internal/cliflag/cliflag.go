// Package cliflag holds what kvgate's commands share about flags: parsing
// (flags only, no positional arguments) and turning a parsed flag set back
// into a command line, so that a parent building a child's argv uses the
// child's own flag definitions and the two cannot drift apart.
package cliflag

import (
	"flag"
	"fmt"
	"strings"
)

// Args returns --name=value for every flag of set whose value differs from
// the same flag in defaults (a set built the same way from default
// options), in the flags' lexical order. A flag named in skip (an alias
// writing the same field as another) is left out.
func Args(set, defaults *flag.FlagSet, skip ...string) []string {
	var args []string
	set.VisitAll(func(f *flag.Flag) {
		for _, s := range skip {
			if f.Name == s {
				return
			}
		}
		v := f.Value.String()
		if d := defaults.Lookup(f.Name); d != nil && d.Value.String() == v {
			return
		}
		args = append(args, "--"+f.Name+"="+v)
	})
	return args
}

// List is a repeatable flag of comma-separated values: each use appends
// its non-empty, trimmed items to *Vals. String joins them with Sep
// (default ","), so that Args writes a value Set reads back.
type List struct {
	Vals *[]string
	Sep  string
}

func (l List) String() string {
	if l.Vals == nil {
		return ""
	}
	sep := l.Sep
	if sep == "" {
		sep = ","
	}
	return strings.Join(*l.Vals, sep)
}

// Set appends v's comma-separated items.
func (l List) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l.Vals = append(*l.Vals, s)
		}
	}
	return nil
}

// Parse parses args into fs and refuses positional arguments: every
// kvgate command takes flags only, so a stray word is a mistake to report
// rather than drop.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}
