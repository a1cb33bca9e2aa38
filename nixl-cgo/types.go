package nixl

import "fmt"

// MemType is a descriptor's memory segment type (nixl_mem_t; the numbers are
// the C API's nixl_capi_mem_type_t).
type MemType int

const (
	DRAM   MemType = 0
	VRAM   MemType = 1
	Block  MemType = 2
	Object MemType = 3
	File   MemType = 4
)

func (m MemType) String() string {
	switch m {
	case DRAM:
		return "DRAM_SEG"
	case VRAM:
		return "VRAM_SEG"
	case Block:
		return "BLK_SEG"
	case Object:
		return "OBJ_SEG"
	case File:
		return "FILE_SEG"
	}
	return fmt.Sprintf("MEM(%d)", int(m))
}

// XferOp is a transfer's direction: READ pulls remote memory into local
// memory, WRITE pushes local memory to the remote.
type XferOp int

const (
	Read  XferOp = 0
	Write XferOp = 1
)

func (o XferOp) String() string {
	switch o {
	case Read:
		return "READ"
	case Write:
		return "WRITE"
	}
	return fmt.Sprintf("XFER_OP(%d)", int(o))
}

// Desc is one memory descriptor {addr, len, devId}. Addr is a plain number:
// memory behind it is never Go heap memory.
type Desc struct {
	Addr  uintptr
	Len   uint64
	DevID uint64
}

func (d Desc) end() uint64 { return uint64(d.Addr) + d.Len }

// contains reports whether d lies inside r (same device).
func (r Desc) contains(d Desc) bool {
	return d.DevID == r.DevID && uint64(d.Addr) >= uint64(r.Addr) && d.end() <= r.end() && d.end() >= uint64(d.Addr)
}

// DescList is a typed descriptor list: registration lists (nixl_reg_dlist_t)
// and transfer lists (nixl_xfer_dlist_t) have the same shape here.
type DescList struct {
	Type  MemType
	Descs []Desc
}

// Params is a backend's string→string parameter map (nixl_b_params_t).
type Params map[string]string

// XferOpts are a transfer request's optional arguments (nixl_opt_args_t).
type XferOpts struct {
	// NotifMsg is sent to the remote agent once the transfer's data has
	// completed, when HasNotif is set.
	NotifMsg []byte
	HasNotif bool
}

// Telemetry is one transfer request's measurements
// (nixl_xfer_telem_t: start, post and transfer durations, bytes, descriptors).
type Telemetry struct {
	StartTimeUS    int64
	PostDurationUS int64
	XferDurationUS int64
	TotalBytes     uint64
	DescCount      int
}

// AgentStats are an agent's running totals.
type AgentStats struct {
	XfersPosted, XfersDone, XfersFailed uint64
	BytesDone                           uint64
	NotifsSent, NotifsReceived          uint64
	NotifsDropped                       uint64
}
