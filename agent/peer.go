package agent

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	nixl "github.com/kvgate/kvgate/nixl-cgo"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// peer is a remote agent whose NIXL metadata is loaded.
type peer struct {
	addr    string
	name    string
	conn    *grpc.ClientConn
	client  agentv1.KVTransferClient
	regions map[string]*agentv1.RegionInfo
	cpu     *agentv1.RegionInfo
	used    uint64 // Agent.peerUses at its last pull: the least recent makes room
}

// peerFor returns the peer at addr, doing the handshake on first use.
func (a *Agent) peerFor(ctx context.Context, addr string) (*peer, error) {
	a.mu.Lock()
	p, ok := a.peers[addr]
	if ok {
		a.peerUses++
		p.used = a.peerUses
	}
	a.mu.Unlock()
	if ok {
		return p, nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "peer %q: %v", addr, err)
	}
	c := agentv1.NewKVTransferClient(conn)
	md, err := c.GetMetadata(ctx, &agentv1.GetMetadataRequest{})
	if err != nil {
		conn.Close()
		return nil, status.Errorf(codes.Unavailable, "handshake with agent %s: %v", addr, err)
	}
	a.mu.Lock()
	bb := a.blockSize
	a.mu.Unlock()
	if md.BlockBytes != uint64(bb) {
		conn.Close()
		return nil, status.Errorf(codes.FailedPrecondition, "block_len mismatch: agent %s uses %d-byte blocks, this one %d", addr, md.BlockBytes, bb)
	}
	// The claim is checked before loading: loading replaces whatever is
	// loaded under the metadata's name, and a refused handshake must leave
	// nothing behind.
	if err := a.nx.LoadRemoteMDAs(md.AgentName, md.NixlMetadata); err != nil {
		conn.Close()
		return nil, status.Errorf(codes.FailedPrecondition, "agent %s (calls itself %q) metadata: %v", addr, md.AgentName, err)
	}
	p = &peer{addr: addr, name: md.AgentName, conn: conn, client: c, regions: map[string]*agentv1.RegionInfo{}, cpu: md.CpuTier}
	for _, r := range md.Regions {
		p.regions[r.EngineId] = r
	}
	a.mu.Lock()
	if old, ok := a.peers[addr]; ok { // raced with another handshake
		a.mu.Unlock()
		conn.Close()
		return old, nil
	}
	// A peer is forgotten when a transfer with it fails; one that is
	// simply gone (its pod rescheduled elsewhere) never fails one, so the
	// table is kept at its bound by dropping the least recently used.
	// Its NIXL metadata stays loaded while another address names the same
	// agent (this one, often): the agent did not fail, and dropping it
	// would fail that address's next pull into a handshake again.
	var victim *peer
	shared := false
	if len(a.peers) >= maxPeers {
		for _, q := range a.peers {
			if victim == nil || q.used < victim.used {
				victim = q
			}
		}
		delete(a.peers, victim.addr)
	}
	a.peerUses++
	p.used = a.peerUses
	a.peers[addr] = p
	if victim != nil {
		for _, q := range a.peers {
			shared = shared || q.name == victim.name
		}
	}
	a.mu.Unlock()
	if victim != nil {
		a.log.Debug("peer table full; forgetting the least recently used", "peer", victim.addr, "bound", maxPeers)
		victim.conn.Close()
		if !shared {
			a.dropMD(victim.name)
		}
	}
	return p, nil
}

// forget drops a peer after a failed transfer, so the next pull
// handshakes again (a restarted peer has new addresses and rkeys).
// Dropping the peer's NIXL metadata also drops it for every other address
// the same agent is known by: their pulls then find none (see
// handshakeAgain).
func (a *Agent) forget(p *peer) {
	a.mu.Lock()
	if a.peers[p.addr] == p {
		delete(a.peers, p.addr)
	}
	a.mu.Unlock()
	p.conn.Close()
	a.dropMD(p.name)
}

// dropMD unloads a peer agent's NIXL metadata and closes its endpoints;
// NIXL refuses while a transfer with it runs, and the metadata then stays
// until the next handshake replaces it.
func (a *Agent) dropMD(name string) {
	if err := a.nx.InvalidateRemoteMD(name); err != nil && !errors.Is(err, nixl.ErrNotFound.Err()) {
		a.log.Debug("invalidate peer metadata", "peer", name, "err", err)
	}
}

// PullBlocks READs blocks from a peer agent into the engine's region and
// notifies the source once they landed.
func (a *Agent) PullBlocks(ctx context.Context, req *agentv1.PullBlocksRequest) (*agentv1.PullBlocksResponse, error) {
	if err := checkHashes(req.Hashes); err != nil {
		return nil, err
	}
	if req.Peer == "" {
		return nil, status.Error(codes.InvalidArgument, "peer is required")
	}
	timeout := a.cfg.PullTimeout
	if req.TimeoutMs > 0 {
		timeout = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a.mu.Lock()
	r, err := a.regionLocked(req.EngineId)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	p, err := a.peerFor(ctx, req.Peer)
	if err != nil {
		return nil, a.pullFailed(err)
	}
	bb := uint64(r.pool.slotBytes)
	var remote []uint32
	var notif string
	// locate is the base address of the peer's area the remote blocks lie
	// in, as its handshake listed the areas, or why it has none.
	var locate func(p *peer) (uint64, error)
	switch src := req.Source.(type) {
	case *agentv1.PullBlocksRequest_Prefill:
		pf := src.Prefill
		locate = func(p *peer) (uint64, error) {
			ri, ok := p.regions[pf.RemoteEngineId]
			if !ok {
				return 0, status.Errorf(codes.NotFound, "agent %s has no region for engine %q", req.Peer, pf.RemoteEngineId)
			}
			for _, id := range pf.RemoteBlockIds {
				if id >= ri.Slots {
					return 0, status.Errorf(codes.InvalidArgument, "remote block %d out of range (engine %s has %d)", id, pf.RemoteEngineId, ri.Slots)
				}
			}
			return ri.BaseAddr, nil
		}
		if _, err := locate(p); status.Code(err) == codes.NotFound {
			// The peer may have registered this engine's region after our
			// handshake (a server that started or restarted): fetch its
			// metadata anew, once.
			if p, err = a.handshakeAgain(ctx, p); err != nil {
				return nil, a.pullFailed(err)
			}
		}
		if _, err := locate(p); err != nil {
			return nil, a.pullFailed(err)
		}
		if len(pf.RemoteBlockIds) != len(req.Hashes) {
			return nil, a.pullFailed(status.Errorf(codes.InvalidArgument, "%d remote blocks for %d hashes", len(pf.RemoteBlockIds), len(req.Hashes)))
		}
		remote = pf.RemoteBlockIds
		tp := max(pf.TpSize, 1)
		notif = pf.RemoteRequestId + ":" + strconv.FormatUint(uint64(tp), 10)
	case *agentv1.PullBlocksRequest_Cpu:
		if p.cpu == nil {
			return &agentv1.PullBlocksResponse{}, nil
		}
		pin, err := p.client.PinBlocks(ctx, &agentv1.PinBlocksRequest{Hashes: req.Hashes, LeaseMs: uint32(timeout.Milliseconds())})
		if err != nil {
			return nil, a.pullFailed(status.Errorf(codes.Unavailable, "pin blocks at agent %s: %v", req.Peer, err))
		}
		if len(pin.Slots) == 0 {
			return &agentv1.PullBlocksResponse{}, nil
		}
		// The peer's answer is input: it pins a prefix of the hashes, in
		// its own tier.
		if len(pin.Slots) > len(req.Hashes) {
			return nil, a.pullFailed(status.Errorf(codes.Unavailable, "agent %s pinned %d blocks for %d hashes", req.Peer, len(pin.Slots), len(req.Hashes)))
		}
		locate = func(p *peer) (uint64, error) {
			if p.cpu == nil {
				return 0, status.Errorf(codes.Unavailable, "agent %s has no CPU tier any more", req.Peer)
			}
			for _, s := range pin.Slots {
				if s >= p.cpu.Slots {
					return 0, status.Errorf(codes.Unavailable, "agent %s pinned CPU block %d out of range (it has %d)", req.Peer, s, p.cpu.Slots)
				}
			}
			return p.cpu.BaseAddr, nil
		}
		if _, err := locate(p); err != nil {
			return nil, a.pullFailed(err)
		}
		remote, notif = pin.Slots, pin.LeaseId+":1"
	default:
		return nil, status.Error(codes.InvalidArgument, "source (prefill or cpu) is required")
	}
	hashes := req.Hashes[:len(remote)]
	if len(remote) == 0 {
		// A full local hit: nothing to read, but the source must free.
		err := a.nx.GenNotif(p.name, []byte(notif))
		if errors.Is(err, nixl.ErrNotFound.Err()) {
			// The peer's metadata is gone (see handshakeAgain).
			if p, err = a.handshakeAgain(ctx, p); err != nil {
				return nil, a.pullFailed(err)
			}
			err = a.nx.GenNotif(p.name, []byte(notif))
		}
		if err != nil {
			return nil, a.pullFailed(status.Errorf(codes.Unavailable, "%v", err))
		}
		return &agentv1.PullBlocksResponse{}, nil
	}
	// Local slots, pinned for the transfer, in a region still live: the
	// range of a retired one may be handed to another server's file (see
	// mapping) once no pull writes into it.
	a.mu.Lock()
	if a.regions[req.EngineId] != r {
		a.mu.Unlock()
		return nil, a.pullFailed(status.Errorf(codes.Aborted, "engine %s registered again during the pull", req.EngineId))
	}
	slots, fresh := make([]uint32, 0, len(hashes)), make([]bool, 0, len(hashes))
	for _, h := range hashes {
		s, f, err := r.pool.acquire(h)
		if err != nil {
			r.pool.giveBack(slots, fresh)
			a.mu.Unlock()
			return nil, a.pullFailed(status.Errorf(codes.ResourceExhausted, "engine %s region: %v", req.EngineId, err))
		}
		slots, fresh = append(slots, s), append(fresh, f)
	}
	r.m.writers++
	a.mu.Unlock()
	local := nixl.DescList{Type: nixl.DRAM, Descs: make([]nixl.Desc, len(slots))}
	for i, s := range slots {
		local.Descs[i] = nixl.Desc{Addr: addr(r.pool.bytes(s)), Len: bb}
	}
	read := func(p *peer) (time.Duration, error) {
		base, err := locate(p)
		if err != nil {
			return 0, err
		}
		rem := nixl.DescList{Type: nixl.DRAM, Descs: make([]nixl.Desc, len(slots))}
		for i := range slots {
			rem.Descs[i] = nixl.Desc{Addr: uintptr(base + uint64(remote[i])*bb), Len: bb}
		}
		return a.read(ctx, p, local, rem, notif)
	}
	start := time.Now()
	post, err := read(p)
	if errors.Is(err, nixl.ErrNotFound.Err()) {
		// Refused before anything moved (see handshakeAgain): the slots
		// are as they were.
		if p, err = a.handshakeAgain(ctx, p); err == nil {
			start = time.Now()
			post, err = read(p)
		}
	}
	dur := time.Since(start)
	if a.cfg.Transfers != nil {
		a.cfg.Transfers.ObserveTransfer(req.Peer, uint64(len(slots))*bb, dur, err != nil)
	}
	a.mu.Lock()
	r.m.writers--
	for _, s := range slots {
		if err != nil {
			r.pool.drop(s) // its bytes are torn
		} else {
			r.pool.unpin(s)
		}
	}
	a.mu.Unlock()
	if _, ok := status.FromError(err); ok && err != nil {
		return nil, a.pullFailed(err) // the new handshake's, or locate's
	}
	if err != nil {
		if nixl.StatusOf(err) == nixl.ErrRemoteDisconnect || nixl.StatusOf(err) == nixl.ErrCanceled {
			a.forget(p)
		}
		code := codes.Unavailable
		if ctx.Err() != nil {
			code = codes.DeadlineExceeded
		}
		return nil, a.pullFailed(status.Errorf(code, "READ of %d blocks from agent %s: %v", len(slots), req.Peer, err))
	}
	a.mu.Lock()
	a.stats.Pulls++
	a.stats.PulledBytes += uint64(len(slots)) * bb
	a.mu.Unlock()
	return &agentv1.PullBlocksResponse{Slots: slots, Bytes: uint64(len(slots)) * bb, TransferUs: uint64(dur.Microseconds()),
		PostUs: uint64(post.Microseconds())}, nil
}

// handshakeAgain drops the peer and handshakes with its address anew: for
// a region the peer registered after the handshake, or when NIXL refused a
// transfer or notification to it with NIXL_ERR_NOT_FOUND. NIXL checks a
// request against the metadata it has loaded before anything moves, and
// refuses it so when it has none under the peer's name any more or when
// the peer's areas, as its handshake listed them, are not in it: both
// happen once the peer restarted and a pull under another address of the
// same agent, or an agent sharing its name, dropped or reloaded the
// metadata. That peer is known under this address only by its stale
// handshake, which no disconnect will clear any more, so without a new
// handshake every pull under this address failed for good.
func (a *Agent) handshakeAgain(ctx context.Context, p *peer) (*peer, error) {
	a.forget(p)
	return a.peerFor(ctx, p.addr)
}

func (a *Agent) pullFailed(err error) error {
	a.mu.Lock()
	a.stats.PullFailures++
	a.mu.Unlock()
	return err
}

// read runs one NIXL READ with its notification and waits for it; it
// returns how long the post took.
func (a *Agent) read(ctx context.Context, p *peer, local, remote nixl.DescList, notif string) (time.Duration, error) {
	x, err := a.nx.CreateXferReq(nixl.Read, local, remote, p.name, nixl.XferOpts{HasNotif: true, NotifMsg: []byte(notif)})
	if err != nil {
		return 0, err
	}
	defer func() {
		if rerr := a.nx.ReleaseXferReq(x); rerr != nil {
			a.log.Debug("release transfer", "err", rerr)
		}
	}()
	start := time.Now()
	_, err = a.nx.PostXferReq(x)
	post := time.Since(start)
	if err != nil {
		return post, err
	}
	return post, a.nx.Wait(ctx, x)
}
