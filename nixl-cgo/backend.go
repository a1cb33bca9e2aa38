package nixl

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// backendEngine is a transfer backend as the Agent drives it: the
// operations of NIXL's backend plugin API (nixlBackendEngine) that the
// agent model uses. The Agent keeps validation, registrations, metadata
// encoding, peers and the request model; a backend maps memory, connects
// and moves bytes. The Agent calls it under its lock, one call at a time,
// except the wait function armWait returns.
type backendEngine interface {
	// supportsMem refuses memory types the backend cannot register
	// (getSupportedMems), with an *Error naming the type.
	supportsMem(t MemType) error
	// registerMem maps one descriptor (registerMem).
	registerMem(t MemType, d Desc) (backendMem, error)
	// deregisterMem unmaps a registration (deregisterMem).
	deregisterMem(m backendMem)
	// connInfo is what a peer needs to connect, for the local metadata
	// (getConnInfo; UCX: one worker address per worker).
	connInfo() [][]byte
	// loadRemote takes a peer's section of its metadata, connection info
	// and regions' public data (loadRemoteConnInfo, loadRemoteMD).
	// Connecting may be deferred to the first use; a peer refused here
	// (connection info the backend cannot read safely) leaves nothing to
	// close, and one returned holds nothing until its first use.
	loadRemote(md *backendMD) (backendPeer, error)
	// progress makes at most rounds rounds of progress and reports
	// whether the backend was still busy (progress).
	progress(rounds int) (busy bool)
	// getNotifs hands every notification payload received since the last
	// call to yield and returns the number the backend dropped in all
	// (getNotifs).
	getNotifs(yield func(payload []byte)) (dropped uint64)
	// armWait readies the backend's event sources for the progress
	// goroutine: nil means events are pending (progress again), otherwise
	// a function that sleeps, without the Agent's lock, until an event or
	// the timeout.
	armWait() func(timeout time.Duration)
	// signal wakes a sleeping armWait function (Close).
	signal()
	// close releases the backend; registrations and peers are gone first.
	close()
}

// backendMem is one registration; publicMD is what a peer needs to reach
// it (getPublicData; UCX: the packed rkey).
type backendMem interface {
	publicMD() []byte
}

// backendPeer is the backend's side of one loaded remote agent.
type backendPeer interface {
	// prepXfer makes a request handle (prepXfer): per descriptor the local
	// address, the remote address, the length and the index of the remote
	// region (in the peer's metadata order) it lies in.
	prepXfer(op XferOp, laddr []uintptr, raddr, lens []uint64, regions []int) backendXfer
	// genNotif sends a notification payload on its own (genNotif).
	genNotif(payload []byte) error
	// failed is the connection's failure, if it has one.
	failed() error
	// abort ends every request in progress to the peer (canceled); the
	// peer must be loaded again to be used.
	abort()
	// close disconnects (disconnect, unloadMD).
	close()
}

// backendXfer is a prepared request; it may be posted again once its last
// post ended and was released.
type backendXfer interface {
	// post starts the transfer; notif, when not nil, reaches the peer
	// only after the data completed (postXfer).
	post(notif []byte) error
	// check progresses at most spins rounds and reports InProg, Success
	// or the error that ended the transfer (checkXfer).
	check(spins int) (Status, error)
	// release frees what the ended post held (releaseReqH).
	release()
}

// engineOpts are the Agent's settings a backend is created with.
type engineOpts struct {
	// wakeup asks for event sources armWait can sleep on (a progress
	// goroutine that does not spin).
	wakeup bool
}

// backendPlugin is an entry of the plugin registry.
type backendPlugin struct {
	params map[string]string // parameter → meaning (getPluginParams)
	create func(p Params, o engineOpts) (backendEngine, error)
}

// backendPlugins are the backends CreateBackend makes, by type name. The
// map is fixed at build time; a backend over libnixl's C API (on nodes
// that have NIXL) would be one more entry, in a file built with its cgo
// flags.
var backendPlugins = map[string]backendPlugin{
	"UCX": {params: ucxParams, create: newUCXBackend},
}

// AvailablePlugins lists the backend types CreateBackend accepts, sorted.
func AvailablePlugins() []string {
	return slices.Sorted(maps.Keys(backendPlugins))
}

// PluginParams lists a backend type's parameters with their meaning
// (getPluginParams).
func PluginParams(typ string) (map[string]string, error) {
	p, ok := backendPlugins[typ]
	if !ok {
		return nil, unknownPlugin("getPluginParams", typ)
	}
	return maps.Clone(p.params), nil
}

func unknownPlugin(op, typ string) error {
	return errorf(op, ErrNotFound, "no backend plugin %q (available: %s)", typ, strings.Join(AvailablePlugins(), ", "))
}
