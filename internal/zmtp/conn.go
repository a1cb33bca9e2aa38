package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Type is a ZMQ socket type as READY's Socket-Type property names it.
type Type string

// The socket types kvgate speaks or accepts as peers.
const (
	PUB    Type = "PUB"
	SUB    Type = "SUB"
	XPUB   Type = "XPUB"
	XSUB   Type = "XSUB"
	ROUTER Type = "ROUTER"
	DEALER Type = "DEALER"
	REQ    Type = "REQ"
	REP    Type = "REP"
)

// compatible lists the peer types each socket type may talk to (ZMTP 3.x,
// the socket-type compatibility table of RFC 23).
var compatible = map[Type][]Type{
	PUB:    {SUB, XSUB},
	XPUB:   {SUB, XSUB},
	SUB:    {PUB, XPUB},
	XSUB:   {PUB, XPUB},
	ROUTER: {DEALER, REQ, ROUTER},
	DEALER: {ROUTER, REP, DEALER},
	REQ:    {ROUTER, REP},
	REP:    {DEALER, REQ},
}

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

const (
	greetingSize = 64
	// maxCommandSize bounds a command frame (READY's metadata, a
	// subscription topic). libzmq's commands are a few hundred bytes.
	maxCommandSize = 64 << 10
	// growChunk is the first read buffer of a large frame; it doubles as
	// bytes arrive, so a declared size costs nothing until it is sent.
	growChunk = 64 << 10
)

// Defaults for zero Limits.
const (
	DefaultMaxMessageSize = 16 << 20
	DefaultMaxFrames      = 16
)

// Errors a connection can end with; callers branch on them with errors.Is.
var (
	// ErrTooLarge: a peer declared a frame or message beyond Limits.
	ErrTooLarge = errors.New("zmtp: message exceeds the size limit")
	// ErrProtocol: bytes that are not ZMTP 3.x, or a peer of the wrong type.
	ErrProtocol = errors.New("zmtp: protocol error")
	// ErrBudget: the Allocator refused the bytes of a message being read.
	ErrBudget = errors.New("zmtp: memory budget exhausted")
)

// Limits bound what one connection may make its reader hold.
type Limits struct {
	// MaxMessageSize bounds the bytes of one message, all frames together.
	// Larger declarations end the connection with ErrTooLarge.
	MaxMessageSize int64
	// MaxFrames bounds the frames of one message.
	MaxFrames int
	// MessageTimeout, when set, bounds the time from a message's first
	// byte to its last, so that a peer cannot hold a half-sent message
	// (and its buffer) forever. Waiting for the first byte is not bounded.
	// It replaces any read deadline the caller set.
	MessageTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxMessageSize <= 0 {
		l.MaxMessageSize = DefaultMaxMessageSize
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultMaxFrames
	}
	return l
}

// An Allocator accounts for the bytes a connection's reader holds.
// Reserve is called before a read buffer grows by n bytes; an error aborts
// the read and ends the connection (wrapped in ErrBudget). Release gives
// back bytes of a message that was not delivered. A delivered Msg carries
// its Reserved count, which its consumer releases when done with it.
type Allocator interface {
	Reserve(n int) error
	Release(n int)
}

// Msg is one received message.
type Msg struct {
	Frames [][]byte
	// Subscribe or Cancel marks a subscription change (a ZMTP 3.1 command
	// or a 3.0 message starting with 1 or 0, as a Pub sees them); Topic is
	// its prefix and Frames is nil.
	Subscribe, Cancel bool
	Topic             []byte
	// Reserved is what the message's buffers took from the Allocator.
	Reserved int
}

// Conn is one ZMTP connection past its handshake.
type Conn struct {
	nc    net.Conn
	r     *bufio.Reader
	self  Type
	peer  Type
	id    []byte // the peer's Identity property
	minor byte   // the peer's ZMTP minor version
	lim   Limits
	alloc Allocator

	wmu sync.Mutex // serializes writes
	w   *bufio.Writer
}

// HandshakeConfig says what a connection's local side is.
type HandshakeConfig struct {
	Type     Type
	Identity []byte // sent as READY's Identity (DEALER, ROUTER, REQ); at most 255 bytes
	Limits   Limits
}

// Handshake runs the ZMTP 3.x greeting and NULL handshake on nc, all of it
// before deadline (nc's deadline is cleared afterwards). On error nc is
// left open for the caller to close.
func Handshake(nc net.Conn, cfg HandshakeConfig, deadline time.Time) (*Conn, error) {
	if _, ok := compatible[cfg.Type]; !ok {
		return nil, fmt.Errorf("zmtp: unknown socket type %q", cfg.Type)
	}
	if len(cfg.Identity) > 255 {
		return nil, fmt.Errorf("zmtp: identity of %d bytes, at most 255", len(cfg.Identity))
	}
	if err := nc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	c := &Conn{
		nc: nc, r: bufio.NewReaderSize(nc, 16<<10), w: bufio.NewWriterSize(nc, 16<<10),
		self: cfg.Type, lim: cfg.Limits.withDefaults(),
	}
	// The whole greeting goes at once: every ZMTP 3 peer (libzmq included)
	// reads it in parts as it needs them.
	var g [greetingSize]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	copy(g[12:32], "NULL")
	if _, err := c.w.Write(g[:]); err != nil {
		return nil, err
	}
	ready := appendProperty(nil, "Socket-Type", []byte(cfg.Type))
	if cfg.Type == DEALER || cfg.Type == ROUTER || cfg.Type == REQ {
		ready = appendProperty(ready, "Identity", cfg.Identity)
	}
	if err := c.writeCommand("READY", ready); err != nil {
		return nil, err
	}
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	if err := c.readGreeting(); err != nil {
		return nil, err
	}
	name, body, err := c.readCommand()
	if err != nil {
		return nil, err
	}
	switch name {
	case "READY":
	case "ERROR":
		return nil, fmt.Errorf("%w: peer refused the handshake: %q", ErrProtocol, errorReason(body))
	default:
		return nil, fmt.Errorf("%w: %q command before READY", ErrProtocol, name)
	}
	if err := c.parseReady(body); err != nil {
		return nil, err
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Conn) readGreeting() error {
	var g [greetingSize]byte
	// Signature and major version first: a peer that is not ZMTP at all is
	// refused before more is read.
	if _, err := io.ReadFull(c.r, g[:11]); err != nil {
		return err
	}
	if g[0] != 0xff || g[9]&1 != 1 {
		return fmt.Errorf("%w: not a ZMTP greeting", ErrProtocol)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: ZMTP %d.x is not supported (3.x is)", ErrProtocol, g[10])
	}
	if _, err := io.ReadFull(c.r, g[11:]); err != nil {
		return err
	}
	c.minor = g[11]
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q (only NULL is supported)", ErrProtocol, mech)
	}
	return nil
}

func (c *Conn) parseReady(body []byte) error {
	for len(body) > 0 {
		n := int(body[0])
		if len(body) < 1+n+4 {
			return fmt.Errorf("%w: truncated READY property", ErrProtocol)
		}
		name := string(body[1 : 1+n])
		vlen := binary.BigEndian.Uint32(body[1+n:])
		body = body[1+n+4:]
		if uint64(vlen) > uint64(len(body)) {
			return fmt.Errorf("%w: truncated READY property %q", ErrProtocol, name)
		}
		val := body[:vlen]
		body = body[vlen:]
		switch {
		case asciiEqualFold(name, "Socket-Type"):
			c.peer = Type(val)
		case asciiEqualFold(name, "Identity"):
			c.id = bytes.Clone(val)
		}
	}
	for _, t := range compatible[c.self] {
		if t == c.peer {
			return nil
		}
	}
	return fmt.Errorf("%w: a %s socket cannot talk to a %q peer", ErrProtocol, c.self, c.peer)
}

func asciiEqualFold(a, b string) bool {
	return len(a) == len(b) && bytes.EqualFold([]byte(a), []byte(b))
}

func appendProperty(b []byte, name string, val []byte) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(val)))
	return append(b, val...)
}

func errorReason(body []byte) string {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return ""
	}
	return string(body[1 : 1+int(body[0])])
}

// SetAllocator makes a accounts for the messages Recv reads from now on;
// nil accounts nothing. Call it from the reading goroutine.
func (c *Conn) SetAllocator(a Allocator) { c.alloc = a }

// PeerType is the peer's Socket-Type.
func (c *Conn) PeerType() Type { return c.peer }

// PeerIdentity is the peer's Identity property (empty when it sent none).
func (c *Conn) PeerIdentity() []byte { return c.id }

// RemoteAddr is the peer's network address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Close closes the connection; a blocked Recv returns.
func (c *Conn) Close() error { return c.nc.Close() }

// SetReadDeadline bounds the next Recv calls.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

// writeCommand buffers one command frame; the caller flushes.
func (c *Conn) writeCommand(name string, data []byte) error {
	size := 1 + len(name) + len(data)
	c.writeHeader(flagCommand, size)
	c.w.WriteByte(byte(len(name)))
	c.w.WriteString(name)
	_, err := c.w.Write(data)
	return err
}

func (c *Conn) writeHeader(flags byte, size int) {
	if size > 255 {
		var b [9]byte
		b[0] = flags | flagLong
		binary.BigEndian.PutUint64(b[1:], uint64(size))
		c.w.Write(b[:])
		return
	}
	c.w.Write([]byte{flags, byte(size)})
}

// Send writes one multipart message and flushes it, within deadline when
// it is not zero.
func (c *Conn) Send(deadline time.Time, frames ...[]byte) error {
	if len(frames) == 0 {
		return fmt.Errorf("zmtp: a message needs at least one frame")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.nc.SetWriteDeadline(deadline); err != nil {
		return err
	}
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		c.writeHeader(flags, len(f))
		if _, err := c.w.Write(f); err != nil {
			return err
		}
	}
	return c.w.Flush()
}

// SendSubscribe tells a PUB peer to send messages whose first frame
// starts with topic (as the ZMTP 3.0 message form, which every 3.x
// publisher understands).
func (c *Conn) SendSubscribe(deadline time.Time, topic []byte) error {
	return c.Send(deadline, append([]byte{1}, topic...))
}

// Recv reads the next message. It answers PING commands itself and skips
// other commands it does not need. On a Pub's side of a connection (the
// peer is SUB or XSUB) a subscription, in either ZMTP form, is returned
// as Msg.Subscribe or Msg.Cancel. After an error the connection is not
// usable: the stream may be mid-frame.
func (c *Conn) Recv() (Msg, error) {
	var m Msg
	var total int64
	timed := c.lim.MessageTimeout > 0
	if timed {
		defer c.nc.SetReadDeadline(time.Time{})
	}
	for started := false; ; {
		flags, err := c.r.ReadByte()
		if err != nil {
			c.release(&m)
			return Msg{}, err
		}
		if timed && !started {
			started = true
			if err := c.nc.SetReadDeadline(time.Now().Add(c.lim.MessageTimeout)); err != nil {
				return Msg{}, err
			}
		}
		size, err := c.readSize(flags)
		if err != nil {
			c.release(&m)
			return Msg{}, err
		}
		if flags&flagCommand != 0 {
			if len(m.Frames) > 0 || flags&flagMore != 0 {
				c.release(&m)
				return Msg{}, fmt.Errorf("%w: command inside a multipart message", ErrProtocol)
			}
			if size > maxCommandSize {
				return Msg{}, fmt.Errorf("%w: command of %d bytes", ErrTooLarge, size)
			}
			body := make([]byte, size)
			if _, err := io.ReadFull(c.r, body); err != nil {
				return Msg{}, err
			}
			name, data, err := splitCommand(body)
			if err != nil {
				return Msg{}, err
			}
			switch name {
			case "SUBSCRIBE", "CANCEL":
				if c.peer == SUB || c.peer == XSUB {
					return Msg{Subscribe: name == "SUBSCRIBE", Cancel: name == "CANCEL", Topic: data}, nil
				}
			case "PING":
				if err := c.pong(data); err != nil {
					return Msg{}, err
				}
			case "ERROR":
				return Msg{}, fmt.Errorf("%w: peer error %q", ErrProtocol, errorReason(data))
			}
			if timed {
				// Back to waiting for a message, which may take any time.
				started = false
				if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
					return Msg{}, err
				}
			}
			continue
		}
		if len(m.Frames) >= c.lim.MaxFrames {
			c.release(&m)
			return Msg{}, fmt.Errorf("%w: more than %d frames", ErrTooLarge, c.lim.MaxFrames)
		}
		total += size
		if total > c.lim.MaxMessageSize {
			c.release(&m)
			return Msg{}, fmt.Errorf("%w: %d bytes or more, at most %d", ErrTooLarge, total, c.lim.MaxMessageSize)
		}
		f, err := c.readFrame(int(size), &m)
		if err != nil {
			c.release(&m)
			return Msg{}, err
		}
		m.Frames = append(m.Frames, f)
		if flags&flagMore == 0 {
			break
		}
	}
	if (c.peer == SUB || c.peer == XSUB) && len(m.Frames) == 1 && len(m.Frames[0]) > 0 && m.Frames[0][0] <= 1 {
		f := m.Frames[0]
		return Msg{Subscribe: f[0] == 1, Cancel: f[0] == 0, Topic: f[1:], Reserved: m.Reserved}, nil
	}
	return m, nil
}

func (c *Conn) readSize(flags byte) (int64, error) {
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, fmt.Errorf("%w: frame flags %#x", ErrProtocol, flags)
	}
	if flags&flagLong == 0 {
		b, err := c.r.ReadByte()
		return int64(b), err
	}
	var b [8]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint64(b[:])
	if n > uint64(c.lim.MaxMessageSize) {
		return 0, fmt.Errorf("%w: a frame of %d bytes, at most %d", ErrTooLarge, n, c.lim.MaxMessageSize)
	}
	return int64(n), nil
}

// readFrame reads size bytes, growing the buffer as they arrive and
// reserving each growth from the Allocator.
func (c *Conn) readFrame(size int, m *Msg) ([]byte, error) {
	first := min(size, growChunk)
	if err := c.reserve(first, m); err != nil {
		return nil, err
	}
	b := make([]byte, 0, first)
	for len(b) < size {
		if len(b) == cap(b) {
			grow := min(size-len(b), cap(b))
			if err := c.reserve(grow, m); err != nil {
				return nil, err
			}
			nb := make([]byte, len(b), len(b)+grow)
			copy(nb, b)
			b = nb
		}
		n, err := io.ReadFull(c.r, b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (c *Conn) reserve(n int, m *Msg) error {
	if c.alloc == nil || n == 0 {
		return nil
	}
	if err := c.alloc.Reserve(n); err != nil {
		return fmt.Errorf("%w: %w", ErrBudget, err)
	}
	m.Reserved += n
	return nil
}

func (c *Conn) release(m *Msg) {
	if c.alloc != nil && m.Reserved > 0 {
		c.alloc.Release(m.Reserved)
		m.Reserved = 0
	}
}

func splitCommand(body []byte) (string, []byte, error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: malformed command", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// pong answers a ZMTP 3.1 PING with its context (at most 16 bytes).
func (c *Conn) pong(ping []byte) error {
	if len(ping) < 2 {
		return fmt.Errorf("%w: short PING", ErrProtocol)
	}
	ctx := ping[2:]
	if len(ctx) > 16 {
		ctx = ctx[:16]
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	if err := c.writeCommand("PONG", ctx); err != nil {
		return err
	}
	return c.w.Flush()
}

// readCommand reads one command frame (the handshake's READY or ERROR).
func (c *Conn) readCommand() (string, []byte, error) {
	flags, err := c.r.ReadByte()
	if err != nil {
		return "", nil, err
	}
	size, err := c.readSize(flags)
	if err != nil {
		return "", nil, err
	}
	if flags&flagCommand == 0 || flags&flagMore != 0 {
		return "", nil, fmt.Errorf("%w: a message frame before READY", ErrProtocol)
	}
	if size > maxCommandSize {
		return "", nil, fmt.Errorf("%w: command of %d bytes", ErrTooLarge, size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return "", nil, err
	}
	return splitCommand(body)
}
