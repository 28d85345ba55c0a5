use super::*;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Instant;

use kloop_protocol::encode_frame;
use kloop_protocol::frame::HEADER_LEN;
use kloop_protocol::{FrameDecoder, FrameKind, Message};

#[test]
fn vm_hwm_is_read_from_proc_status() {
    // From a real /proc/<pid>/stat of QEMU, the name altered to hold
    // the characters that make naive splitting wrong.
    let stat =
        "4321 (qemu (x) y) S 1 4321 4321 0 -1 4194560 9411 0 0 0 250 37 0 0 20 0 3 0 5511 1 2 3";
    assert_eq!(parse_stat_cpu_ticks(stat), Some(287));
    assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    let status = "Name:\tqemu\nVmPeak:\t 900 kB\nVmHWM:\t  345612 kB\nVmRSS:\t 1 kB\n";
    assert_eq!(parse_vm_hwm(status), Some(345612));
    assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
    // Our own process has one, so the real file parses too.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(parse_vm_hwm(&own).unwrap() > 0);
}

/// A two-vCPU TCG guest of `arch` with the data channel, artefacts in
/// `/runs/a,b` (a comma QEMU must see doubled).
fn tcg_guest(arch: kloop_protocol::Arch, qemu: &str, kernel: &str) -> VmConfig {
    VmConfig {
        qemu: qemu.into(),
        arch,
        kernel: kernel.into(),
        initramfs: Some("/k/init.cpio".into()),
        accel: Accel::Tcg,
        cpus: 2,
        memory_mib: 256,
        cmdline: vec![],
        artefacts: "/runs/a,b".into(),
        deadlines: Deadlines::for_accel(Accel::Tcg),
        data_channel: true,
        icount: false,
        channel_limit: DEFAULT_CHANNEL_LIMIT,
        start: Default::default(),
        console: Default::default(),
    }
}

#[test]
fn argv_has_no_shell_and_escapes_commas() {
    let cfg = tcg_guest(
        kloop_protocol::Arch::X86_64,
        "/usr/bin/qemu-system-x86_64",
        "/k/vmlinuz",
    );
    let argv: Vec<String> = cfg
        .argv(Path::new("/s/qmp.sock"), Path::new("/s/data.sock"))
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect();
    assert!(argv.contains(&"file,id=console,path=/runs/a,,b/console.log".to_string()));
    assert!(argv.contains(&"socket,id=data,server=off,path=/s/data.sock".to_string()));
    assert!(argv.contains(&"unix:/s/qmp.sock,server=on,wait=off".to_string()));
    let append = argv.iter().position(|a| a == "-append").unwrap();
    assert!(argv[append + 1].starts_with("console=ttyS0 panic=-1"));
    assert_eq!(argv.iter().filter(|a| *a == "-serial").count(), 2);

    // On the terminal: stdio behind the multiplexer, signals off, and
    // still logged to console.log.
    let on_terminal: Vec<String> = VmConfig {
        console: Console::Terminal,
        ..cfg
    }
    .argv(Path::new("/s/qmp.sock"), Path::new("/s/data.sock"))
    .into_iter()
    .map(|s| s.into_string().unwrap())
    .collect();
    assert!(on_terminal.contains(
        &"stdio,id=console,mux=on,signal=off,logfile=/runs/a,,b/console.log".to_string()
    ));
    assert!(!on_terminal.iter().any(|a| a.starts_with("file,id=console")));
}

/// A save and its restores must describe the same machine to QEMU (the
/// RAM block's name and size are in the stream): the one RAM backend,
/// shared for the save (the file gets the memory), private for a restore
/// (the file is never written), nothing of it on a cold boot.
#[test]
fn saved_vms_keep_their_ram_in_a_file_mapped_shared_then_private() {
    let cfg = |start: GuestStart| VmConfig {
        qemu: "/usr/bin/qemu-system-x86_64".into(),
        arch: kloop_protocol::Arch::X86_64,
        kernel: "/k/vmlinuz".into(),
        initramfs: Some("/k/init.cpio".into()),
        accel: Accel::Tcg,
        cpus: 2,
        memory_mib: 512,
        cmdline: vec![],
        artefacts: "/runs/a".into(),
        deadlines: Deadlines::for_accel(Accel::Tcg),
        data_channel: true,
        icount: false,
        channel_limit: DEFAULT_CHANNEL_LIMIT,
        start,
        console: Default::default(),
    };
    let argv = |start: GuestStart| -> Vec<String> {
        cfg(start)
            .argv(Path::new("/s/qmp.sock"), Path::new("/s/data.sock"))
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    };
    let save = argv(GuestStart::BootAndSave {
        vmstate: "/c/vm/vmstate.partial".into(),
        ram: "/c/v,m/ram.partial".into(),
    });
    let restore = argv(GuestStart::Restore {
        vmstate: "/c/vm/vmstate".into(),
        ram: "/c/v,m/ram".into(),
        to_guest: vec![1, 2],
    });
    let boot = argv(GuestStart::Boot);
    let after =
        |a: &[String], flag: &str| a.iter().position(|x| x == flag).map(|i| a[i + 1].clone());
    assert_eq!(
        after(&save, "-object").as_deref(),
        Some("memory-backend-file,id=kloop-ram,size=512M,mem-path=/c/v,,m/ram.partial,share=on")
    );
    assert_eq!(
        after(&restore, "-object").as_deref(),
        Some("memory-backend-file,id=kloop-ram,size=512M,mem-path=/c/v,,m/ram,share=off")
    );
    for a in [&save, &restore] {
        assert_eq!(
            after(a, "-machine").as_deref(),
            Some("pc,memory-backend=kloop-ram")
        );
        assert_eq!(after(a, "-m").as_deref(), Some("512"));
    }
    assert_eq!(after(&restore, "-incoming").as_deref(), Some("defer"));
    assert_eq!(after(&save, "-incoming"), None);
    assert_eq!(after(&boot, "-object"), None);
    assert_eq!(after(&boot, "-machine").as_deref(), Some("pc"));
    // Apart from the backend's file, share mode and the restore's
    // -incoming (and the console appended to), the save and the restore
    // are the same command line.
    let strip = |a: &[String]| -> Vec<String> {
        let mut out = Vec::new();
        let mut it = a.iter();
        while let Some(x) = it.next() {
            match x.as_str() {
                "-object" | "-incoming" => {
                    it.next();
                }
                _ => out.push(x.replace(",append=on", "")),
            }
        }
        out
    };
    assert_eq!(strip(&save), strip(&restore));
}

#[test]
fn standalone_argv_needs_no_kloop() {
    let cfg = VmConfig {
        qemu: "/usr/bin/qemu-system-x86_64".into(),
        arch: kloop_protocol::Arch::X86_64,
        kernel: "bzImage".into(),
        initramfs: Some("initramfs.cpio".into()),
        accel: Accel::Tcg,
        cpus: 2,
        memory_mib: 512,
        cmdline: vec!["kloop.extra=1".into()],
        artefacts: ".".into(),
        deadlines: Deadlines::for_accel(Accel::Tcg),
        data_channel: true,
        icount: true,
        channel_limit: DEFAULT_CHANNEL_LIMIT,
        start: Default::default(),
        console: Default::default(),
    };
    let argv: Vec<String> = cfg
        .standalone_argv(Path::new("data.bin"))
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect();
    // No QMP socket, no firmware path that may not exist elsewhere, no
    // socket for the data port: a file.
    assert!(!argv
        .iter()
        .any(|a| a == "-qmp" || a == "-bios" || a.contains("socket")));
    assert!(argv.contains(&"stdio,id=console".to_string()));
    assert!(argv.contains(&"file,id=data,path=data.bin".to_string()));
    assert_eq!(argv.iter().filter(|a| *a == "-serial").count(), 2);
    // What shapes the guest is the trial's.
    for kept in [
        "bzImage",
        "initramfs.cpio",
        "max,-cx16",
        "shift=0,sleep=off",
        "512",
    ] {
        assert!(argv.contains(&kept.to_string()), "{kept} missing: {argv:?}");
    }
    let append = argv.iter().position(|a| a == "-append").unwrap();
    assert!(argv[append + 1].ends_with("kloop.extra=1"));
}

fn hello() -> Message {
    Message::Hello {
        protocol_version: kloop_protocol::PROTOCOL_VERSION,
        agent_version: "t".into(),
        uname: Default::default(),
        online_cpus: vec![0],
        monotonic_ns: 1,
    }
}

/// Feeds `stream` in `chunk`-byte reads; returns the session, how it
/// ended (if it did) and the decoder.
fn feed_all(stream: &[u8], chunk: usize) -> (GuestSession, Option<SessionEnd>, FrameDecoder) {
    let mut s = GuestSession::default();
    let mut d = FrameDecoder::new();
    let started = Instant::now();
    for c in stream.chunks(chunk) {
        if let Some(end) = s.feed(&mut d, c, started) {
            return (s, Some(end), d);
        }
        assert!(d.pending() < HEADER_LEN + kloop_protocol::MAX_PAYLOAD);
    }
    // A framing error ends the session once its grace period is over.
    let end = s.protocol_error_expired(Instant::now() + PROTOCOL_ERROR_GRACE);
    (s, end, d)
}

fn protocol_error(end: Option<SessionEnd>) -> String {
    match end {
        Some(SessionEnd::Protocol(m)) => m,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn session_collects_frames_in_any_read_size() {
    let mut stream = hello().to_frame();
    for f in kloop_protocol::records_frames(0, 0, &[1u8; 100_000]) {
        stream.extend(f);
    }
    stream.extend(
        Message::Done {
            records_bytes: 100_000,
        }
        .to_frame(),
    );
    for chunk in [1, 13, 64 * 1024] {
        let (s, end, _) = feed_all(&stream, chunk);
        assert_eq!(end, Some(SessionEnd::Done), "chunk {chunk}");
        assert_eq!(s.streams[&0].len(), 100_000);
        assert!(s.hello_at.is_some() && s.last_frame_at.is_some());
        assert_eq!(s.bytes as usize, stream.len());
    }
}

#[test]
fn records_with_a_wrong_stream_offset_are_a_protocol_error() {
    let mut stream = hello().to_frame();
    stream.extend(kloop_protocol::records_frames(2, 0, &[1u8; 40]).concat());
    let at = stream.len();
    // A chunk claiming to start at 48 while 40 bytes arrived: a gap.
    stream.extend(kloop_protocol::records_frames(2, 48, &[1u8; 8]).concat());
    let m = protocol_error(feed_all(&stream, 4096).1);
    assert!(
        m.contains(&format!("stream offset {at}"))
            && m.contains("listener 2")
            && m.contains("ring offset 48")
            && m.contains("40 bytes"),
        "{m}"
    );
}

#[test]
fn short_records_and_bad_messages_name_their_offset() {
    let h = hello().to_frame();
    let mut stream = h.clone();
    stream.extend(encode_frame(FrameKind::Records, &[0u8; 5]));
    let m = protocol_error(feed_all(&stream, 4096).1);
    assert!(
        m.contains(&format!("stream offset {}", h.len())) && m.contains("shorter"),
        "{m}"
    );
    for payload in [
        &b"{not json"[..],
        br#"{"msg":"launch-missiles"}"#,
        b"\xff\xfe",
    ] {
        let mut stream = h.clone();
        stream.extend(encode_frame(FrameKind::Message, payload));
        let m = protocol_error(feed_all(&stream, 4096).1);
        assert!(
            m.contains(&format!(
                "message frame at stream offset {} does not decode",
                h.len()
            )),
            "{m}"
        );
    }
}

#[test]
fn framing_errors_end_the_session_with_the_offset() {
    let h = hello().to_frame();
    // Garbage, a wrong checksum, an absurd length, an unknown kind.
    let mut bad_crc = Message::Log { text: "x".into() }.to_frame();
    bad_crc[HEADER_LEN] ^= 0x20;
    let mut too_long = Message::Log { text: "x".into() }.to_frame();
    too_long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut unknown = Message::Log { text: "x".into() }.to_frame();
    unknown[4] = 0x7f;
    for (bad, says) in [
        (b"\x00garbage\r\n".to_vec(), "no frame magic"),
        (bad_crc, "checksum mismatch"),
        (too_long, "announces 4294967295 payload bytes"),
        (unknown, "unknown frame kind 127"),
    ] {
        let mut stream = h.clone();
        stream.extend(&bad);
        stream.extend(Message::Done { records_bytes: 0 }.to_frame());
        for chunk in [1, 4096] {
            let m = protocol_error(feed_all(&stream, chunk).1);
            assert!(
                m.contains(says) && m.contains(&format!("stream offset {}", h.len())),
                "chunk {chunk}: {m}"
            );
        }
    }
}

#[test]
fn a_frame_cut_short_is_noted_with_its_offset() {
    let h = hello().to_frame();
    let mut stream = h.clone();
    stream.extend(&Message::Log { text: "cut".into() }.to_frame()[..20]);
    let (mut s, end, mut d) = feed_all(&stream, 4096);
    assert_eq!(end, None);
    assert_eq!(s.salvage(&mut d, Instant::now()), None);
    assert_eq!(s.trailing, Some((h.len() as u64, 20)));
}

fn agent_panic_frame() -> Vec<u8> {
    Message::AgentError {
        step: Some(3),
        message: "agent panicked: panicked at guest/src/agent.rs:1:1: boom".into(),
    }
    .to_frame()
}

#[test]
fn a_panic_written_over_a_cut_frame_is_the_agents_failure() {
    // The panicking thread had sent a header announcing 4096 bytes and
    // 100 of them; its panic hook then wrote its report over the rest.
    let h = hello().to_frame();
    let mut stream = h.clone();
    let full = encode_frame(FrameKind::Records, &[7u8; 4096]);
    stream.extend(&full[..HEADER_LEN + 100]);
    stream.extend(agent_panic_frame());
    for chunk in [1, 4096] {
        let (mut s, end, mut d) = feed_all(&stream, chunk);
        assert_eq!(end, None, "the cut frame still waits for its bytes");
        match s.salvage(&mut d, Instant::now()) {
            Some(SessionEnd::AgentError(m)) => {
                assert!(m.starts_with("step 3: agent panicked: "), "{m}");
                assert!(
                    m.contains(&format!("stream offset {} never completed", h.len())),
                    "{m}"
                );
            }
            other => panic!("chunk {chunk}: expected the agent's error, got {other:?}"),
        }
    }
}

#[test]
fn a_panic_after_garbage_is_the_agents_failure_and_other_frames_are_not() {
    let h = hello().to_frame();
    let mut stream = h.clone();
    stream.extend(b"\x00half a frame".as_slice());
    stream.extend(Message::Log { text: "x".into() }.to_frame());
    stream.extend(agent_panic_frame());
    let mut s = GuestSession::default();
    let mut d = FrameDecoder::new();
    match s.feed(&mut d, &stream, Instant::now()) {
        Some(SessionEnd::AgentError(m)) => {
            assert!(
                m.contains("agent panicked") && m.contains("no frame magic"),
                "{m}"
            )
        }
        other => panic!("expected the agent's error, got {other:?}"),
    }
    // The Log after the error was not taken as evidence.
    assert!(!s.messages.iter().any(|m| matches!(m, Message::Log { .. })));
    // Without last words the error stands, after the grace period only.
    let mut stream = h.clone();
    stream.extend(b"\x00half a frame".as_slice());
    stream.extend(Message::Done { records_bytes: 0 }.to_frame());
    let mut s = GuestSession::default();
    let mut d = FrameDecoder::new();
    assert_eq!(s.feed(&mut d, &stream, Instant::now()), None);
    assert_eq!(s.protocol_error_expired(Instant::now()), None);
    assert!(matches!(
        s.salvage(&mut d, Instant::now()),
        Some(SessionEnd::Protocol(m)) if m.contains("no frame magic")
    ));
}

#[test]
fn a_session_stops_taking_bytes_at_its_channel_limit() {
    let mut s = GuestSession {
        channel_limit: 10_000,
        ..GuestSession::default()
    };
    let mut d = FrameDecoder::new();
    let started = Instant::now();
    assert_eq!(s.feed(&mut d, &hello().to_frame(), started), None);
    let mut end = None;
    for f in kloop_protocol::records_frames(0, 0, &[1u8; 50_000]) {
        end = s.feed(&mut d, &f, started);
        if end.is_some() {
            break;
        }
    }
    match end {
        Some(SessionEnd::Infrastructure(m)) => {
            assert!(
                m.contains("more than 9.8 KiB") && m.contains(CHANNEL_LIMIT_ENV),
                "{m}"
            )
        }
        other => panic!("expected the limit, got {other:?}"),
    }
    assert!(s.streams.values().map(Vec::len).sum::<usize>() <= 10_000);
}

#[test]
fn channel_limit_sizes() {
    assert_eq!(parse_size("1G"), Some(1 << 30));
    assert_eq!(parse_size("300m"), Some(300 << 20));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("lots"), None);
    assert_eq!(human_bytes(256 << 20), "256 MiB");
}

#[test]
fn noise_never_panics_the_session() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200 {
        let mut stream = hello().to_frame();
        let len = 1 + (round * 97) % 5000;
        stream.extend((0..len).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        // Either a protocol error or a wait for more bytes; never a panic.
        let (_, end, d) = feed_all(&stream, 1 + round % 300);
        assert!(
            matches!(end, None | Some(SessionEnd::Protocol(_))),
            "{end:?}"
        );
        assert!(d.pending() < HEADER_LEN + kloop_protocol::MAX_PAYLOAD);
    }
}

#[test]
fn exit_statuses_in_words() {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        describe_exit(&ExitStatus::from_raw(9)),
        "was killed by signal 9 (SIGKILL)"
    );
    assert_eq!(
        describe_exit(&ExitStatus::from_raw(1 << 8)),
        "exited with code 1"
    );
    assert_eq!(signal_name(64), "signal 64");
}

#[test]
fn console_panic_finds_the_panic_lines() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("console.log");
    std::fs::write(
        &p,
        "booting\nok\nsysrq: Trigger a crash\nKernel panic - not syncing: sysrq triggered crash\nCPU: 0 PID: 1\n",
    )
    .unwrap();
    let panic = console_panic(&p).unwrap();
    assert!(panic.contains("Kernel panic - not syncing: sysrq triggered crash"));
    // As QEMU writes it: SeaBIOS's screen codes, then the kernel, unbroken.
    std::fs::write(
        &p,
        "\x1bc\x1b[?7l\x1b[2J\x1b[0mSeaBIOS\r\nProbing EDD... ok\x1bc\x1b[?7l\x1b[2J[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b\n",
    )
    .unwrap();
    assert_eq!(
        console_panic(&p).unwrap(),
        "SeaBIOS\nProbing EDD... ok\n[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b"
    );
    assert_eq!(console_tail(&p, 2), "SeaBIOS\nProbing EDD... ok[    3.7] Kernel panic - not syncing: Attempted to kill init! exitcode=0x0000000b");
    std::fs::write(&p, "booting\nall fine\n").unwrap();
    assert!(console_panic(&p).is_none());
    assert!(console_oops(&p).is_none());
    assert_eq!(console_tail(&p, 1), "all fine");
}

/// The start of a console log from a real run (a mutant of 6.12's
/// `__bpf_ksym_del`, booted with `oops=panic panic=-1 loglevel=4`): the
/// kernel restarted before the rest of the oops, and its panic line,
/// reached the serial console.
const OOPS_WITHOUT_PANIC_LINE: &str = "Oops: general protection fault, probably for non-canonical address 0x6666660a64657270: 0000 [#1] SMP
CPU: 0 UID: 0 PID: 1 Comm: init Tainted: G        W          6.12.117 #25 
Tainted: [W]=WARN
RIP: 0010:sized_strscpy+0x40/0x9a
RSP: 0018:ffff88800028bd88 EFLAGS: 00000216
Call Trace:
 <TASK>
 ? bpf_get_kallsym+0x6f/0x92
";

#[test]
fn console_oops_finds_an_oops_whose_panic_line_was_lost() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("console.log");
    std::fs::write(&p, OOPS_WITHOUT_PANIC_LINE).unwrap();
    assert!(console_panic(&p).is_none());
    let oops = console_oops(&p).unwrap();
    assert!(oops.starts_with("Oops: general protection fault"), "{oops}");
    assert!(oops.contains("RIP: 0010:sized_strscpy"), "{oops}");
    // A WARN alone is not an oops: the kernel carries on.
    std::fs::write(
        &p,
        "------------[ cut here ]------------\nWARNING: CPU: 0 PID: 1 at kernel/x.c:1 f+0x1/0x2\n",
    )
    .unwrap();
    assert!(console_oops(&p).is_none());
}

/// An arm64 guest: the `virt` board under TCG whatever the accelerator
/// asked, no firmware, the PL011 console and the data channel on a
/// virtio-serial port, no second UART.
#[test]
fn an_arm64_guest_boots_virt_with_its_data_channel_on_virtio_serial() {
    let cfg = VmConfig {
        // KVM asked: an arm64 guest still runs under TCG.
        accel: Accel::Kvm,
        cmdline: vec!["x=1".into()],
        ..tcg_guest(
            kloop_protocol::Arch::Arm64,
            "/usr/bin/qemu-system-aarch64",
            "/k/Image",
        )
    };
    let argv: Vec<String> = cfg
        .argv(Path::new("/s/qmp.sock"), Path::new("/s/data.sock"))
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect();
    let after = |flag: &str| argv[argv.iter().position(|a| a == flag).unwrap() + 1].clone();
    assert_eq!(after("-machine"), "virt");
    assert_eq!(after("-accel"), "tcg,thread=single");
    assert_eq!(after("-cpu"), "max,pauth-impdef=on");
    assert!(!argv.iter().any(|a| a == "-bios"), "{argv:?}");
    let append = after("-append");
    assert!(append.starts_with("console=ttyAMA0 panic=-1"), "{append}");
    assert!(
        append.ends_with(" x=1") && !append.contains("no_timer_check"),
        "{append}"
    );
    assert_eq!(argv.iter().filter(|a| *a == "-serial").count(), 1);
    assert!(argv.contains(&"virtio-serial-device".to_string()));
    assert!(argv.contains(&format!(
        "virtserialport,chardev=data,name={}",
        kloop_protocol::VIRTIO_DATA_PORT_NAME
    )));
}
