package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Config configures a Host.
type Config struct {
	// Module is the compiled .wasm file.
	Module []byte
	// PluginConfig and VMConfig are what the filter reads as its plugin and
	// VM configuration (Envoy's configuration and vm_config.configuration).
	PluginConfig []byte
	VMConfig     []byte
	// MaxVMs bounds the pool; Acquire waits when all are in use. Default 4.
	MaxVMs int
	// MemoryLimitPages bounds each VM's linear memory in 64 KiB pages.
	// Default 4096 (256 MiB).
	MemoryLimitPages uint32
	// CompilationCache, when set, lets Hosts of the same module share
	// compiled code (compiling a Go-built filter takes seconds).
	CompilationCache wazero.CompilationCache
	Logger           *slog.Logger
}

// ErrMissingImport means the module needs ABI functions this host lacks.
var ErrMissingImport = errors.New("wasmhost: module imports a function the host does not provide")

// ErrVMStart means the filter refused its VM or plugin configuration.
var ErrVMStart = errors.New("wasmhost: filter failed to start")

// Host owns the compiled filter and its VM pool. It is safe for
// concurrent use.
type Host struct {
	cfg      Config
	runtime  wazero.Runtime
	compiled wazero.CompiledModule
	log      *slog.Logger

	// idle holds started VMs not in use; slots holds one token per VM that
	// may exist, so len(slots) free tokens = VMs that may still be created.
	idle  chan *VM
	slots chan struct{}

	mu     sync.Mutex
	closed bool
}

// New compiles the module, checks its imports and starts one VM, so that
// a bad module or configuration fails here rather than on a request.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.MaxVMs <= 0 {
		cfg.MaxVMs = 4
	}
	if cfg.MemoryLimitPages == 0 {
		cfg.MemoryLimitPages = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// No WithCloseOnContextDone: its interruption checks made the Go-built
	// filter 5x slower (BenchmarkFilter), and the filter's work is bounded
	// by its body limit, so a deadline has nothing to stop.
	rc := wazero.NewRuntimeConfig().WithMemoryLimitPages(cfg.MemoryLimitPages)
	if cfg.CompilationCache != nil {
		rc = rc.WithCompilationCache(cfg.CompilationCache)
	}
	r := wazero.NewRuntimeWithConfig(ctx, rc)
	h := &Host{
		cfg:     cfg,
		runtime: r,
		log:     cfg.Logger,
		idle:    make(chan *VM, cfg.MaxVMs),
		slots:   make(chan struct{}, cfg.MaxVMs),
	}
	fail := func(err error) (*Host, error) {
		_ = r.Close(ctx)
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		return fail(fmt.Errorf("wasmhost: wasi: %w", err))
	}
	provided, err := exportABI(ctx, r)
	if err != nil {
		return fail(fmt.Errorf("wasmhost: host module: %w", err))
	}
	if h.compiled, err = r.CompileModule(ctx, cfg.Module); err != nil {
		return fail(fmt.Errorf("wasmhost: compile: %w", err))
	}
	for _, f := range h.compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod == "env" && !provided[name] {
			return fail(fmt.Errorf("%w: %s", ErrMissingImport, name))
		}
	}
	for range cfg.MaxVMs {
		h.slots <- struct{}{}
	}
	vm, err := h.Acquire(ctx)
	if err != nil {
		return fail(err)
	}
	h.Release(vm)
	return h, nil
}

// Acquire returns a VM owned by the caller until Release. It starts a new
// VM while fewer than MaxVMs exist, else waits for one.
func (h *Host) Acquire(ctx context.Context) (*VM, error) {
	select {
	case vm := <-h.idle:
		return vm, nil
	default:
	}
	select {
	case vm := <-h.idle:
		return vm, nil
	case <-h.slots:
		vm, err := h.startVM(ctx)
		if err != nil {
			h.slots <- struct{}{}
			return nil, err
		}
		return vm, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Release returns vm to the pool. A VM that trapped is closed instead and
// its slot freed, so the next Acquire starts a fresh one.
func (h *Host) Release(vm *VM) {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if vm.broken || closed {
		_ = vm.mod.Close(context.Background())
		h.slots <- struct{}{}
		return
	}
	h.idle <- vm
}

// Close closes every VM and the runtime. VMs still acquired are closed
// with the runtime; their callers get errors.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	return h.runtime.Close(ctx)
}

func (h *Host) startVM(ctx context.Context) (*VM, error) {
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions("_initialize").
		WithStdout(logWriter{h.log, "stdout"}).
		WithStderr(logWriter{h.log, "stderr"})
	vm := &VM{host: h, rootID: 1, nextID: 2}
	cctx := withVM(ctx, vm)
	mod, err := h.runtime.InstantiateModule(cctx, h.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("wasmhost: instantiate: %w", err)
	}
	vm.mod = mod
	if err := vm.bindExports(); err != nil {
		_ = mod.Close(ctx)
		return nil, err
	}
	if _, err := vm.call(cctx, vm.onContextCreate, uint64(vm.rootID), 0); err != nil {
		_ = mod.Close(ctx)
		return nil, err
	}
	ok, err := vm.call(cctx, vm.onVMStart, uint64(vm.rootID), uint64(len(h.cfg.VMConfig)))
	if err == nil && ok == 0 {
		err = fmt.Errorf("%w: proxy_on_vm_start returned false", ErrVMStart)
	}
	if err == nil {
		ok, err = vm.call(cctx, vm.onConfigure, uint64(vm.rootID), uint64(len(h.cfg.PluginConfig)))
		if err == nil && ok == 0 {
			err = fmt.Errorf("%w: proxy_on_configure returned false (see the filter's log)", ErrVMStart)
		}
	}
	if err != nil {
		_ = mod.Close(ctx)
		return nil, err
	}
	return vm, nil
}

// logWriter forwards the guest's stdout/stderr to slog, one record per
// write.
type logWriter struct {
	log    *slog.Logger
	stream string
}

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("wasm filter output", "stream", w.stream, "text", string(p))
	return len(p), nil
}

type vmKey struct{}

func withVM(ctx context.Context, vm *VM) context.Context {
	return context.WithValue(ctx, vmKey{}, vm)
}

func vmFrom(ctx context.Context) *VM {
	vm, _ := ctx.Value(vmKey{}).(*VM)
	return vm
}

// VM is one module instance with its root context.
type VM struct {
	host   *Host
	mod    api.Module
	rootID uint32
	nextID uint32
	broken bool
	// cur is the stream whose callback is running; nil between calls.
	cur *Stream

	onContextCreate, onVMStart, onConfigure, onRequestHeaders, onRequestBody,
	onLog, onDelete, alloc api.Function
}

func (vm *VM) bindExports() error {
	for name, dst := range map[string]*api.Function{
		"proxy_on_context_create":  &vm.onContextCreate,
		"proxy_on_vm_start":        &vm.onVMStart,
		"proxy_on_configure":       &vm.onConfigure,
		"proxy_on_request_headers": &vm.onRequestHeaders,
		"proxy_on_request_body":    &vm.onRequestBody,
		"proxy_on_log":             &vm.onLog,
		"proxy_on_delete":          &vm.onDelete,
		"proxy_on_memory_allocate": &vm.alloc,
	} {
		if *dst = vm.mod.ExportedFunction(name); *dst == nil {
			return fmt.Errorf("wasmhost: module does not export %s", name)
		}
	}
	return nil
}

// call runs one guest export; a trap marks the VM broken.
func (vm *VM) call(ctx context.Context, f api.Function, args ...uint64) (uint64, error) {
	res, err := f.Call(ctx, args...)
	if err != nil {
		vm.broken = true
		return 0, fmt.Errorf("wasmhost: %s: %w", f.Definition().Name(), err)
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// MemoryBytes is this VM's linear memory size.
func (vm *VM) MemoryBytes() uint32 { return vm.mod.Memory().Size() }
