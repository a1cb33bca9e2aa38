package zmtp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"
)

// Defaults for zero ServerConfig and DialConfig fields.
const (
	DefaultHandshakeTimeout = 3 * time.Second
	DefaultMaxConns         = 1024
	DefaultRedialMin        = 100 * time.Millisecond
	DefaultRedialMax        = 5 * time.Second
)

// keepAlive finds dead peers (a crashed host's half-open connection) in
// about 25 s instead of Go's default two and a half minutes.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}

// ParseEndpoint turns a ZMQ endpoint into a Go network and address:
// tcp://host:port (host * for every interface, port * or 0 for any) and
// ipc:///path. inproc:// has no meaning across processes and is refused.
func ParseEndpoint(endpoint string) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", "", fmt.Errorf("zmtp: endpoint %q has no scheme (tcp://host:port)", endpoint)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
		}
		if host == "*" {
			host = ""
		}
		if port == "*" {
			port = "0"
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("zmtp: endpoint %q has no path", endpoint)
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("zmtp: endpoint %q: transport %q is not supported (tcp, ipc)", endpoint, scheme)
}

// ServerConfig configures a Server.
type ServerConfig struct {
	HandshakeConfig
	// HandshakeTimeout bounds each connection's handshake.
	HandshakeTimeout time.Duration
	// MaxConns bounds the connections open at once, handshaking or not;
	// beyond it new ones are closed at once.
	MaxConns int
	// Admit, when set, is asked about each connection's remote address
	// before anything is read from it; false closes it.
	Admit func(remote net.Addr) bool
	// TLS, when set, makes the server accept only TLS connections.
	TLS *tls.Config
	// Rejected, when set, is told why a connection was turned away or
	// failed its handshake: "admission", "max_conns", "handshake".
	Rejected func(reason string)
	Logger   *slog.Logger
}

// Server is a bound socket: it accepts connections, handshakes each in its
// own goroutine and hands it to the handler, which owns its reads. A
// Server never dials.
type Server struct {
	cfg     ServerConfig
	ln      net.Listener
	handler func(context.Context, *Conn)
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	slots   chan struct{} // one per open connection

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Listen binds endpoint and serves connections until ctx ends or Close.
func Listen(ctx context.Context, endpoint string, cfg ServerConfig, handler func(context.Context, *Conn)) (*Server, error) {
	network, addr, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if _, ok := compatible[cfg.Type]; !ok {
		return nil, fmt.Errorf("zmtp: unknown socket type %q", cfg.Type)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Server{
		cfg: cfg, ln: ln, handler: handler, ctx: ctx, cancel: cancel,
		slots: make(chan struct{}, cfg.MaxConns), conns: make(map[net.Conn]struct{}),
	}
	s.wg.Go(s.accept)
	s.wg.Go(func() {
		<-ctx.Done()
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
	})
	return s, nil
}

// Addr is the bound address (with the port chosen for port 0 or *).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

func (s *Server) reject(reason string) {
	if s.cfg.Rejected != nil {
		s.cfg.Rejected(reason)
	}
}

// accept only accepts: admission, handshake and reading happen in each
// connection's goroutine, so no peer can hold it up.
func (s *Server) accept() {
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: wait, as
				// net/http does, rather than spin.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.cfg.Logger.Warn("zmtp accept failed; retrying", "err", err, "in", backoff)
				select {
				case <-time.After(backoff):
				case <-s.ctx.Done():
					return
				}
				continue
			}
			s.cfg.Logger.Error("zmtp accept failed", "err", err)
			return
		}
		backoff = 0
		select {
		case s.slots <- struct{}{}:
		default:
			_ = nc.Close()
			s.reject("max_conns")
			continue
		}
		s.mu.Lock()
		s.conns[nc] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(nc) })
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (s *Server) serve(nc net.Conn) {
	defer func() {
		_ = nc.Close()
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		<-s.slots
	}()
	if s.ctx.Err() != nil {
		return
	}
	if s.cfg.Admit != nil && !s.cfg.Admit(nc.RemoteAddr()) {
		s.reject("admission")
		return
	}
	c, err := Handshake(nc, s.cfg.HandshakeConfig, time.Now().Add(s.cfg.HandshakeTimeout))
	if err != nil {
		s.reject("handshake")
		s.cfg.Logger.Debug("zmtp handshake failed", "remote", nc.RemoteAddr(), "err", err)
		return
	}
	s.handler(s.ctx, c)
}

// Close stops accepting, closes every connection and waits for the
// handlers to return.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// DialConfig configures Dial and Redial.
type DialConfig struct {
	HandshakeConfig
	HandshakeTimeout time.Duration
	// TLS, when set, dials TLS (ServerName defaults to the endpoint's host).
	TLS *tls.Config
	// RedialMin and RedialMax bound Redial's backoff between attempts.
	RedialMin, RedialMax time.Duration
	// Unreachable, when set, is called on Redial's goroutine, with the
	// last error, once attempts have failed all the way to RedialMax
	// without a connection: a peer that is not there (a wrong port), as
	// opposed to one restarting. A connection resets it.
	Unreachable func(err error)
	Logger      *slog.Logger
}

func (cfg DialConfig) withDefaults() DialConfig {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.RedialMin <= 0 {
		cfg.RedialMin = DefaultRedialMin
	}
	if cfg.RedialMax < cfg.RedialMin {
		cfg.RedialMax = max(DefaultRedialMax, cfg.RedialMin)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Dial connects to endpoint once and handshakes, within ctx and the
// handshake timeout.
func Dial(ctx context.Context, endpoint string, cfg DialConfig) (*Conn, error) {
	cfg = cfg.withDefaults()
	network, addr, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(addr, ":") || strings.HasSuffix(addr, ":0") {
		return nil, fmt.Errorf("zmtp: cannot connect to %q: it names no host or port", endpoint)
	}
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	d := net.Dialer{Deadline: deadline, KeepAliveConfig: keepAlive}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if cfg.TLS != nil {
		tc := cfg.TLS.Clone()
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(addr)
		}
		nc = tls.Client(nc, tc)
	}
	// Closing the connection is how ctx interrupts the handshake.
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	c, err := Handshake(nc, cfg.HandshakeConfig, deadline)
	if !stop() || err != nil {
		_ = nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return c, nil
}

// Redial keeps a connection to endpoint until ctx ends: it dials, runs
// handler on each established connection (closing it when the handler
// returns), and dials again after a failure or a disconnect, waiting a
// jittered exponential backoff between RedialMin and RedialMax. It returns
// when ctx ends. After an established connection ends, the backoff starts
// over at RedialMin.
func Redial(ctx context.Context, endpoint string, cfg DialConfig, handler func(context.Context, *Conn)) {
	cfg = cfg.withDefaults()
	backoff := cfg.RedialMin
	reported := false // Unreachable called since the last connection
	for ctx.Err() == nil {
		c, err := Dial(ctx, endpoint, cfg)
		if err == nil {
			// As libzmq: after a connection that was established, the
			// next attempt comes after the shortest interval.
			backoff, reported = cfg.RedialMin, false
			stop := context.AfterFunc(ctx, func() { _ = c.Close() })
			handler(ctx, c)
			stop()
			_ = c.Close()
		} else if ctx.Err() == nil {
			cfg.Logger.Debug("zmtp connect failed", "endpoint", endpoint, "err", err, "retry_in", backoff)
			if backoff >= cfg.RedialMax && !reported && cfg.Unreachable != nil {
				reported = true
				cfg.Unreachable(err)
			}
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, cfg.RedialMax)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
