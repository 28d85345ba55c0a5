//! The data port: the second UART, raw mode, one mutex for every frame.
//!
//! Everything here writes whole frames under that mutex, so frames from the
//! heartbeat thread, the side-band thread and the steps never interleave.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use kloop_protocol::{FrameDecoder, Message, RawFrame};

pub struct Port {
    file: Mutex<File>,
    fd: RawFd,
}

static PORT: OnceLock<Port> = OnceLock::new();

/// Opens `path`, puts it in raw mode and installs it as the global port.
/// Returns a description of the line settings for the log.
fn open(path: &str) -> io::Result<String> {
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid path.
    let mut fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    let mut note = String::new();
    if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        // No devtmpfs: make the node ourselves (ttyS<n> is char 4:(64+n)).
        if let Some(n) = path
            .strip_prefix("/dev/ttyS")
            .and_then(|n| n.parse::<u32>().ok())
        {
            let _ = std::fs::create_dir_all("/dev");
            // SAFETY: valid path.
            unsafe {
                libc::mknod(
                    cpath.as_ptr(),
                    libc::S_IFCHR | 0o600,
                    libc::makedev(4, 64 + n),
                )
            };
            note.push_str("created the device node by hand; ");
            fd = unsafe {
                libc::open(
                    cpath.as_ptr(),
                    libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
                )
            };
        }
    }
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    note.push_str(&set_raw(fd)?);
    // SAFETY: we own fd from here on.
    let file = unsafe { File::from_raw_fd(fd) };
    let _ = PORT.set(Port {
        file: Mutex::new(file),
        fd,
    });
    Ok(note)
}

/// Opens the data port of this build's architecture: x86-64's second UART
/// ([`kloop_protocol::DATA_PORT`]); on arm64 the virtio-serial port named
/// [`kloop_protocol::VIRTIO_DATA_PORT_NAME`], once its modules are in
/// (Debian builds virtio, virtio_mmio and virtio_console as modules, so the
/// host ships them). Returns the device's path and the note of [`open`].
pub fn open_data_port() -> io::Result<(String, String)> {
    match kloop_protocol::Arch::OF_THIS_BUILD {
        kloop_protocol::Arch::X86_64 => {
            let path = kloop_protocol::DATA_PORT.to_owned();
            open(&path).map(|note| (path, note))
        }
        kloop_protocol::Arch::Arm64 => {
            let mut loaded = Vec::new();
            for module in ["virtio_mmio", "virtio_console"] {
                let outcomes = crate::modules::insert(module).map_err(|e| {
                    io::Error::other(format!(
                        "loading {module} for the data channel: {}",
                        crate::sys::describe_chain(&e)
                    ))
                })?;
                loaded.extend(outcomes);
            }
            let path = find_virtio_port(kloop_protocol::VIRTIO_DATA_PORT_NAME)?;
            let note = open(&path)?;
            Ok((path, format!("{note}; modules: {}", loaded.join(", "))))
        }
    }
}

/// How long the named virtio port may take to appear: QEMU announces its
/// ports over the control queue after the driver is bound.
const VIRTIO_PORT_WAIT: Duration = Duration::from_secs(10);

/// `/dev/<port>` of the virtio-serial port called `name`, waiting for the
/// device to announce it (`/sys/class/virtio-ports/<port>/name`).
fn find_virtio_port(name: &str) -> io::Result<String> {
    let started = Instant::now();
    loop {
        if let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") {
            for entry in dir.flatten() {
                let named = std::fs::read_to_string(entry.path().join("name"))
                    .is_ok_and(|n| n.trim_end() == name);
                if named {
                    let port = entry.file_name().to_string_lossy().into_owned();
                    let dev = format!("/dev/{port}");
                    if !std::path::Path::new(&dev).exists() {
                        make_node(&dev, &entry.path().join("dev"))?;
                    }
                    return Ok(dev);
                }
            }
        }
        if started.elapsed() > VIRTIO_PORT_WAIT {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no virtio-serial port named {name} in /sys/class/virtio-ports after {} s \
                     (is QEMU's virtserialport there, CONFIG_VIRTIO_CONSOLE and \
                     CONFIG_VIRTIO_MMIO in the kernel?)",
                    VIRTIO_PORT_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The character device `path` from a sysfs `dev` file (`major:minor`),
/// where devtmpfs did not make it.
fn make_node(path: &str, dev_file: &std::path::Path) -> io::Result<()> {
    let text = std::fs::read_to_string(dev_file)?;
    let (major, minor) = text
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| {
            io::Error::other(format!("{}: not major:minor: {text:?}", dev_file.display()))
        })?;
    let cpath = CString::new(path).unwrap();
    // SAFETY: valid path.
    if unsafe {
        libc::mknod(
            cpath.as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(major, minor),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_raw(fd: RawFd) -> io::Result<String> {
    // SAFETY: termios is POD; the fd is valid.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        let e = io::Error::last_os_error();
        // A virtio-serial port is no tty: its bytes pass as they are.
        if e.raw_os_error() == Some(libc::ENOTTY) {
            return Ok("not a tty (virtio-serial): no line settings".to_owned());
        }
        return Err(e);
    }
    unsafe { libc::cfmakeraw(&mut t) };
    t.c_cflag |= libc::CLOCAL | libc::CREAD;
    t.c_cflag &= !libc::CRTSCTS;
    t.c_iflag &= !(libc::IXON | libc::IXOFF | libc::IXANY);
    t.c_cc[libc::VMIN] = 1;
    t.c_cc[libc::VTIME] = 0;
    for (speed, name) in [(libc::B4000000, "4000000"), (libc::B115200, "115200")] {
        // Set CBAUD by hand (CIBAUD 0 = input follows output): the libc
        // crate binds cfsetospeed & co. to versioned glibc symbols that a
        // static link cannot resolve.
        let mut want = t;
        want.c_cflag = (want.c_cflag & !(libc::CBAUD | libc::CIBAUD)) | speed;
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &want) } != 0 {
            continue;
        }
        // tcsetattr succeeds even when the driver clamps the rate: read back.
        let mut got: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut got) } == 0 && got.c_cflag & libc::CBAUD == speed {
            return Ok(format!("raw mode, {name} baud"));
        }
    }
    // Raw mode matters more than the rate (the emulated UART ignores it).
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok("raw mode, driver kept its own baud rate".to_owned())
}

fn port() -> io::Result<&'static Port> {
    PORT.get()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "data port not open"))
}

fn lock(p: &Port) -> MutexGuard<'_, File> {
    p.file.lock().unwrap_or_else(|e| e.into_inner())
}

/// Closes this process's open of the data port, keeping its fd number on
/// /dev/null (so the `Port`'s fd stays valid and what is sent after is
/// dropped): a virtio-serial port (arm64's) opens once at a time
/// (drivers/char/virtio_console.c, port_fops_open(): -EBUSY while
/// `guest_connected`), and `kloop-run` must open it while the shell runs.
pub fn release() -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let p = port()?;
    let _guard = lock(p);
    let null = File::open("/dev/null")?;
    // SAFETY: both fds are valid; dup3 closes the port's description.
    if unsafe { libc::dup3(null.as_raw_fd(), p.fd, libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes one complete frame under the port mutex.
pub fn send_frame(frame: &[u8]) -> io::Result<()> {
    let p = port()?;
    let mut f = lock(p);
    f.write_all(frame)
}

/// Writes one message as a frame.
pub fn send_message(msg: &Message) -> io::Result<()> {
    send_frame(&msg.to_frame())
}

/// Stops every frame for good, heartbeats included: takes the port lock and
/// never gives it back (the fault-injection `hang`). The heartbeat thread
/// then blocks on the lock, so the host sees a silent but living guest.
pub fn silence_forever() -> ! {
    let _guard = PORT.get().map(lock);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The fault-injection `panic-mid-frame`: writes the first `cut` bytes of
/// `frame` and panics while holding the port lock, as a thread that
/// panicked inside a write would. The panic hook then finds the lock held
/// by the panicking thread and writes its report over the cut frame.
pub fn panic_mid_frame(frame: &[u8], cut: usize) -> ! {
    let guard = PORT.get().map(lock);
    if let Some(mut f) = guard {
        let _ = f.write_all(&frame[..cut.min(frame.len())]);
        let _ = f.flush();
        panic!(
            "fault injection: panic in the middle of a frame ({cut} of {} bytes written)",
            frame.len()
        );
    }
    panic!("fault injection: panic in the middle of a frame (no data port)");
}

/// Reads what the host writes to the port until one whole frame decoded,
/// or `timeout` (guest time) passed. Only the runner reads, between the
/// `AwaitingPlan` it sent and the plan it waits for, so no lock is taken.
pub fn receive_frame(timeout: Duration) -> io::Result<RawFrame> {
    let p = port()?;
    let deadline = Instant::now() + timeout;
    let mut decoder = FrameDecoder::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no frame from the host within {} s ({} bytes of a partial frame)",
                    timeout.as_secs(),
                    decoder.pending()
                ),
            ));
        }
        let mut pfd = libc::pollfd {
            fd: p.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let wait_ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if ready == 0 {
            continue;
        }
        // SAFETY: buf is valid for its length; the fd is open.
        let n = unsafe { libc::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            return Err(e);
        }
        decoder.push(&buf[..n as usize]);
        match decoder.next_frame() {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
    }
}

/// Drops whatever the host wrote that nobody read: a by-hand run starts
/// with an empty input, whatever an earlier, interrupted one left behind.
pub fn discard_input() -> io::Result<()> {
    let p = port()?;
    // SAFETY: valid fd.
    if unsafe { libc::tcflush(p.fd, libc::TCIFLUSH) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOTTY) {
        return Err(e);
    }
    // arm64's virtio-serial port is no tty: read what is queued without
    // waiting, until nothing is.
    // SAFETY: valid fd; flags restored below.
    let flags = unsafe { libc::fcntl(p.fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(p.fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    let drained = loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            continue;
        }
        let err = io::Error::last_os_error();
        break match (n, err.raw_os_error()) {
            (0, _) => Ok(()),
            (_, Some(libc::EAGAIN)) => Ok(()),
            (_, Some(libc::EINTR)) => continue,
            _ => Err(err),
        };
    };
    // SAFETY: valid fd, its own flags.
    if unsafe { libc::fcntl(p.fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    drained
}

/// Waits until every byte written has left the UART.
pub fn drain() -> io::Result<()> {
    let p = port()?;
    let _guard = lock(p);
    // SAFETY: valid fd.
    if unsafe { libc::tcdrain(p.fd) } != 0 {
        let e = io::Error::last_os_error();
        // arm64's virtio-serial port is no tty, and has nothing to drain:
        // a blocking write to it returns once the host took the buffer
        // (drivers/char/virtio_console.c, __send_to_port(): "Wait till the
        // host acknowledges it pushed out the data we sent").
        if e.raw_os_error() == Some(libc::ENOTTY) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// Best effort for the panic path: the panicking thread may hold the lock
/// (mid-frame), so give up after a while rather than deadlock.
pub fn send_last_words(msg: &Message) {
    let Some(p) = PORT.get() else { return };
    let deadline = Instant::now() + Duration::from_secs(2);
    let frame = msg.to_frame();
    loop {
        match p.file.try_lock() {
            Ok(mut f) => {
                let _ = f.write_all(&frame);
                break;
            }
            Err(TryLockError::Poisoned(e)) => {
                let _ = e.into_inner().write_all(&frame);
                break;
            }
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(TryLockError::WouldBlock) => {
                // Held by ourselves (panic inside a write): the host resyncs
                // on the next frame magic.
                let mut f = unsafe { File::from_raw_fd(p.fd) };
                let _ = f.write_all(&frame);
                std::mem::forget(f);
                break;
            }
        }
    }
    // SAFETY: valid fd.
    unsafe { libc::tcdrain(p.fd) };
}
