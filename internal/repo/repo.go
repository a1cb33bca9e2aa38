// Package repo finds the kvgate checkout a command or test runs in.
package repo

import (
	"errors"
	"os"
	"path/filepath"
)

// ErrNoRoot is returned when no folder above the working directory holds
// go.mod.
var ErrNoRoot = errors.New("go.mod not found above the working directory")

// Root is the nearest folder at or above the working directory that holds
// go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoRoot
		}
		dir = parent
	}
}
