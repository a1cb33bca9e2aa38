// Package plot renders small line charts as PNG: axes with ticks, labels,
// a legend and one polyline per series. It exists so that benchmark results
// can be drawn without a plotting stack; it draws only what RESULTS.md
// needs.
package plot
