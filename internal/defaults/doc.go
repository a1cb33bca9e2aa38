// Package defaults reads the optional settings of a Config the way kvgate's
// components agree on: a zero value is unset and takes the default, and for
// a duration a negative value turns the limit off.
package defaults
