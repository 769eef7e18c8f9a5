// sandlot-exec: runs a sandbox's commands from inside it, at the cost of a fork.
//
// The agent bind-mounts this static binary read-only into a sandbox (beside the
// files tool, under the container's own /dev tmpfs) and starts it once through the
// runtime's exec, with the process spec any exec of the sandbox gets: its user and
// groups, capabilities, no_new_privileges, seccomp filter, cgroup, namespaces and
// rlimits. Every command after that is a request on its stdin; the command is
// forked from here and inherits all of it, exactly what a runtime exec would have
// set up again at the cost of a runtime and a shim round trip.
//
// stdin and stdout carry frames: kind (1 byte), session (4 bytes), length (4
// bytes, at most maxPayload), payload. The executor is a child subreaper and
// reaps every process under it, so nothing it started becomes a zombie of the
// container. It exits, ending every command it started, when the agent sends
// nothing for the quiet time given as its one argument (the agent pings), or when
// its stdin ends.
//
//	sandlot-exec QUIET_SECONDS
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const (
	maxPayload  = 64 << 10  // bytes of one frame's payload, either way
	window      = 256 << 10 // bytes of one output stream sent and not yet acknowledged
	maxSessions = 1024
	chunk       = 32 << 10
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Frame kinds: the agent's, then the executor's.
const (
	kStart      = 1  // JSON startRequest
	kStdin      = 2  // bytes
	kCloseStdin = 3  //
	kResize     = 4  // width, height: 2 bytes each
	kSignal     = 5  // signal: 4 bytes, sent to the command's process group
	kRelease    = 6  // the session ended: its process group is killed, it is forgotten
	kAck        = 7  // stream (1 byte: 1 stdout, 2 stderr), bytes consumed (4 bytes)
	kPing       = 8  //
	kReady      = 16 // session 0, the protocol's version
	kStarted    = 17 // pid: 4 bytes
	kFailed     = 18 // why, text
	kStdout     = 19
	kStderr     = 20
	kEOF        = 21 // stream: 1 byte
	kExit       = 22 // code: 4 bytes (128+signal when killed)
	kStdinAck   = 23 // bytes of stdin handed to the command (or dropped): 4 bytes
	version     = "sandlot-exec 1"
)

type startRequest struct {
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	Cwd    string   `json:"cwd"`
	TTY    bool     `json:"tty"`
	Stdin  bool     `json:"stdin"`
	Width  uint16   `json:"width"`
	Height uint16   `json:"height"`
}

type output struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending int // bytes sent, not yet acknowledged
}

type session struct {
	id       uint32
	pid      int
	stdin    *os.File // the pipe to the command, or the terminal's master
	in       *inbox   // stdin not yet written, fed by its own goroutine
	master   *os.File
	outs     [2]*output
	released bool
}

var (
	outMu    sync.Mutex
	mu       sync.Mutex // sessions and byPid, and a start with its registration
	sessions = map[uint32]*session{}
	byPid    = map[int]*session{}
	groups   sync.Map // pid -> struct{}: the process groups to kill at shutdown, lock-free
)

func send(kind byte, id uint32, data []byte) {
	buf := make([]byte, 9+len(data))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:5], id)
	binary.BigEndian.PutUint32(buf[5:9], uint32(len(data)))
	copy(buf[9:], data)
	outMu.Lock()
	defer outMu.Unlock()
	if _, err := os.Stdout.Write(buf); err != nil {
		shutdown(3) // the agent is gone: nothing may outlive it here
	}
}

func u32(v uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, v)
	return b
}

func init() {
	// Commands are forked from the main goroutine, kept on the main thread: a
	// parent-death signal follows the thread that forked, which lives as long as this.
	runtime.LockOSThread()
}

func main() {
	quiet := 60 * time.Second
	if len(os.Args) > 1 {
		if s, err := strconv.Atoi(os.Args[1]); err == nil && s > 0 {
			quiet = time.Duration(s) * time.Second
		}
	}
	// PR_SET_CHILD_SUBREAPER: orphans of the commands come here to be reaped.
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, 36, 1, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "cannot become a subreaper: %v\n", e)
		os.Exit(1)
	}
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP, syscall.SIGTTOU, syscall.SIGTTIN)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	go func() {
		for range children {
			reap()
		}
	}()
	heard := make(chan struct{}, 1)
	go func() {
		timer := time.NewTimer(quiet)
		for {
			select {
			case <-heard:
				timer.Reset(quiet)
			case <-timer.C:
				// A sandbox frozen (paused) past the quiet time wakes with the agent's
				// pings waiting in the pipe: a grace to read them before giving up.
				select {
				case <-heard:
					timer.Reset(quiet)
				case <-time.After(2 * time.Second):
					shutdown(2)
				}
			}
		}
	}()
	send(kReady, 0, []byte(version))
	var head [9]byte
	payload := make([]byte, maxPayload)
	for {
		if _, err := io.ReadFull(os.Stdin, head[:]); err != nil {
			shutdown(0)
		}
		n := binary.BigEndian.Uint32(head[5:9])
		if n > maxPayload {
			fmt.Fprintf(os.Stderr, "a frame of %d bytes: more than %d\n", n, maxPayload)
			shutdown(1)
		}
		if _, err := io.ReadFull(os.Stdin, payload[:n]); err != nil {
			shutdown(0)
		}
		select {
		case heard <- struct{}{}:
		default:
		}
		handle(head[0], binary.BigEndian.Uint32(head[1:5]), payload[:n])
	}
}

// shutdown kills every command's process group and exits.
// It takes no lock: a failed send may call it while a start holds mu.
func shutdown(code int) {
	groups.Range(func(pid, _ any) bool {
		syscall.Kill(-pid.(int), syscall.SIGKILL)
		return true
	})
	os.Exit(code)
}

func handle(kind byte, id uint32, data []byte) {
	if kind == kStart {
		start(id, data)
		return
	}
	if kind == kPing {
		return
	}
	mu.Lock()
	s := sessions[id]
	mu.Unlock()
	if s == nil {
		return // ended meanwhile
	}
	switch kind {
	case kStdin:
		if s.in != nil {
			s.in.push(data)
		}
	case kCloseStdin:
		if s.in != nil && s.master == nil {
			s.in.finish()
		}
	case kResize:
		if s.master != nil && len(data) == 4 {
			resize(s.master, binary.BigEndian.Uint16(data[0:2]), binary.BigEndian.Uint16(data[2:4]))
		}
	case kSignal:
		if len(data) == 4 && s.pid > 0 {
			syscall.Kill(-s.pid, syscall.Signal(binary.BigEndian.Uint32(data)))
		}
	case kAck:
		if len(data) == 5 && (data[0] == 1 || data[0] == 2) {
			o := s.outs[data[0]-1]
			if o != nil {
				o.mu.Lock()
				o.pending -= int(binary.BigEndian.Uint32(data[1:5]))
				o.cond.Broadcast()
				o.mu.Unlock()
			}
		}
	case kRelease:
		release(s)
	}
}

func release(s *session) {
	mu.Lock()
	s.released = true
	if s.pid > 0 {
		syscall.Kill(-s.pid, syscall.SIGKILL)
	}
	delete(sessions, s.id)
	groups.Delete(s.pid)
	mu.Unlock()
	if s.in != nil {
		s.in.drop()
	}
	for _, o := range s.outs {
		if o != nil {
			o.mu.Lock()
			o.cond.Broadcast()
			o.mu.Unlock()
		}
	}
}

func hasVar(env []string, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			return true
		}
	}
	return false
}

func lookPath(name string, env []string, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			path = e[5:]
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, name)
		if !filepath.IsAbs(candidate) {
			candidate = filepath.Join(cwd, candidate)
		}
		if st, err := os.Stat(candidate); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}

func start(id uint32, data []byte) {
	var req startRequest
	if err := json.Unmarshal(data, &req); err != nil || len(req.Argv) == 0 {
		send(kFailed, id, []byte("a start request without a command"))
		return
	}
	mu.Lock()
	busy := sessions[id] != nil || len(sessions) >= maxSessions
	mu.Unlock()
	if busy {
		send(kFailed, id, []byte(fmt.Sprintf("session %d is taken or %d are open", id, maxSessions)))
		return
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	// runc gives an exec the HOME of its user when its environment has none, as it
	// gave this executor, which runs as that same user.
	if home := os.Getenv("HOME"); home != "" && !hasVar(req.Env, "HOME") {
		req.Env = append(req.Env, "HOME="+home)
	}
	path, err := lookPath(req.Argv[0], req.Env, cwd)
	if err != nil {
		send(kFailed, id, []byte(err.Error()))
		return
	}
	s := &session{id: id}
	var childFiles []uintptr
	var ours []*os.File   // our ends, read for output
	var theirs []*os.File // the child's ends, closed once it started
	closeAll := func() {
		for _, f := range append(ours, theirs...) {
			f.Close()
		}
		if s.stdin != nil {
			s.stdin.Close()
		}
	}
	sys := &syscall.SysProcAttr{}
	if req.TTY {
		master, slave, err := openPty()
		if err != nil {
			send(kFailed, id, []byte(err.Error()))
			return
		}
		if req.Width > 0 && req.Height > 0 {
			resize(master, req.Width, req.Height)
		}
		s.master, s.stdin = master, master
		theirs = append(theirs, slave)
		fd := slave.Fd()
		childFiles = []uintptr{fd, fd, fd}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		var in *os.File
		if req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				send(kFailed, id, []byte(err.Error()))
				return
			}
			s.stdin, in = w, r
		} else if in, err = os.Open(os.DevNull); err != nil {
			send(kFailed, id, []byte(err.Error()))
			return
		}
		theirs = append(theirs, in)
		childFiles = append(childFiles, in.Fd())
		for i := 0; i < 2; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll()
				send(kFailed, id, []byte(err.Error()))
				return
			}
			ours, theirs = append(ours, r), append(theirs, w)
			childFiles = append(childFiles, w.Fd())
		}
		sys.Setpgid = true
	}
	sys.Pdeathsig = syscall.SIGKILL // an executor ended ends the commands it ran
	mu.Lock()
	pid, err := syscall.ForkExec(path, req.Argv, &syscall.ProcAttr{
		Dir: cwd, Env: req.Env, Files: childFiles, Sys: sys,
	})
	if err == nil {
		s.pid = pid
		sessions[id] = s
		byPid[pid] = s
		groups.Store(pid, struct{}{})
		// Said before the reaper may say its exit: the reaper waits for mu.
		send(kStarted, id, u32(uint32(pid)))
	}
	mu.Unlock()
	for _, f := range theirs {
		f.Close()
	}
	if err != nil {
		for _, f := range ours {
			f.Close()
		}
		if s.stdin != nil {
			s.stdin.Close()
		}
		send(kFailed, id, []byte(fmt.Sprintf("exec %s: %v", req.Argv[0], err)))
		return
	}
	if s.stdin != nil {
		s.in = newInbox()
		go feed(s)
	}
	if req.TTY {
		s.outs[0] = newOutput()
		go pump(s, 0, s.master)
		return
	}
	for i, f := range ours {
		s.outs[i] = newOutput()
		go pump(s, i, f)
	}
}

// inbox holds a command's stdin until its own goroutine writes it: a command that
// does not read its stdin stalls only itself. The agent sends at most a window
// ahead of the acknowledgements, so it stays bounded.
type inbox struct {
	mu       sync.Mutex
	cond     *sync.Cond
	buf      []byte
	finished bool // the agent closed stdin
	dropped  bool // the session ended
}

func newInbox() *inbox {
	in := &inbox{}
	in.cond = sync.NewCond(&in.mu)
	return in
}

func (in *inbox) push(data []byte) {
	in.mu.Lock()
	in.buf = append(in.buf, data...)
	in.cond.Broadcast()
	in.mu.Unlock()
}

func (in *inbox) finish() {
	in.mu.Lock()
	in.finished = true
	in.cond.Broadcast()
	in.mu.Unlock()
}

func (in *inbox) drop() {
	in.mu.Lock()
	in.dropped = true
	in.cond.Broadcast()
	in.mu.Unlock()
}

func feed(s *session) {
	in := s.in
	broken := false
	for {
		in.mu.Lock()
		for len(in.buf) == 0 && !in.finished && !in.dropped {
			in.cond.Wait()
		}
		chunk, done, dropped := in.buf, in.finished, in.dropped
		in.buf = nil
		in.mu.Unlock()
		if len(chunk) > 0 {
			if !broken && !dropped {
				if _, err := s.stdin.Write(chunk); err != nil {
					broken = true // the command left its stdin: what comes goes nowhere
				}
			}
			send(kStdinAck, s.id, u32(uint32(len(chunk))))
			continue
		}
		if dropped || done {
			if s.master == nil {
				s.stdin.Close()
			}
			return
		}
	}
}

func newOutput() *output {
	o := &output{}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// pump sends one output of a command, never more than window bytes ahead of what
// the agent acknowledged: a client that reads slowly holds back its command only.
func pump(s *session, stream int, f *os.File) {
	o := s.outs[stream]
	buf := make([]byte, chunk)
	kind := byte(kStdout + stream)
	for {
		o.mu.Lock()
		for o.pending >= window && !isReleased(s) {
			o.cond.Wait()
		}
		room := window - o.pending
		o.mu.Unlock()
		if isReleased(s) {
			break
		}
		if room > chunk {
			room = chunk
		}
		n, err := f.Read(buf[:room])
		if n > 0 {
			o.mu.Lock()
			o.pending += n
			o.mu.Unlock()
			send(kind, s.id, buf[:n])
		}
		if err != nil { // EOF, or EIO from a terminal nobody holds any more
			break
		}
	}
	if s.master == nil || stream == 0 {
		f.Close()
	}
	send(kEOF, s.id, []byte{byte(stream + 1)})
}

func isReleased(s *session) bool {
	mu.Lock()
	defer mu.Unlock()
	return s.released
}

func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		mu.Lock()
		s := byPid[pid]
		delete(byPid, pid)
		mu.Unlock()
		if s == nil {
			continue // an orphan of a command: reaped, nothing to say
		}
		code := status.ExitStatus()
		if status.Signaled() {
			code = 128 + int(status.Signal())
		}
		send(kExit, s.id, u32(uint32(code)))
	}
}

func ioctl(fd uintptr, req uintptr, arg uintptr) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg); e != 0 {
		return e
	}
	return nil
}

func openPty() (*os.File, *os.File, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("no terminal: %v", err)
	}
	var unlock int32
	if err := ioctl(master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("no terminal: unlockpt: %v", err)
	}
	var n uint32
	if err := ioctl(master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("no terminal: ptsname: %v", err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("no terminal: %v", err)
	}
	return master, slave, nil
}

func resize(master *os.File, width, height uint16) {
	ws := [4]uint16{height, width, 0, 0}
	ioctl(master.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
}
