//! What is particular to a FUSE transport: the fallback from io_uring, and
//! io_uring's queue per CPU.

use super::*;

/// Where the kernel does not offer FUSE over io_uring, the default serves
/// through `/dev/fuse`, and a frontend that insists on io_uring does not
/// start, saying why.
#[test]
fn without_io_uring_the_default_falls_back_to_dev_fuse() {
    let Some(_off) = testbed::fuse_uring::off() else {
        return;
    };
    let env = Env::new(FuseTransport::Auto);
    let device = MemDevice::new(4 * MIB);
    let handle = env.runtime.handle().clone();
    let frontend = FuseFrontend::start(device.clone(), "fallback", &env.options(), handle).unwrap();
    assert_eq!(frontend.transport(), FuseTransport::DevFuse);
    let file = open_direct(frontend.device_path());
    let data = AlignedBuf::from(&random_bytes(BLOCK_SIZE as usize, 7));
    file.write_all_at(data.as_ref(), 0).unwrap();
    let mut back = AlignedBuf::new(BLOCK_SIZE as usize);
    open_direct(frontend.backing_file())
        .read_exact_at(back.as_mut(), 0)
        .unwrap();
    assert_eq!(back.as_ref(), data.as_ref());
    assert_eq!(frontend.ring_requests(), 0);
    drop(file);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);

    let mut options = env.options();
    options.transport = FuseTransport::IoUring;
    let handle = env.runtime.handle().clone();
    let err = FuseFrontend::start(device, "insists", &options, handle).unwrap_err();
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("enable_uring"), "{chain}");
    assert!(mounts_under(&env.path()).is_empty());
}

/// The kernel queues a request on the ring of the CPU that issued it and
/// takes no other: I/O issued from every CPU in turn is answered (a CPU
/// whose ring were not served would hang it).
#[test]
fn io_uring_serves_requests_from_every_cpu() {
    let Some(_on) = testbed::fuse_uring::on() else {
        return;
    };
    let env = Env::new(FuseTransport::IoUring);
    let device = MemDevice::new(4 * MIB);
    let frontend = env.start(&device, "every-cpu");
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let online: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&cpu| cpus.is_set(cpu).unwrap_or(false))
        .collect();
    let (done, finished) = std::sync::mpsc::channel();
    for &cpu in &online {
        let (path, done) = (frontend.backing_file().to_path_buf(), done.clone());
        thread::spawn(move || {
            let mut on_cpu = nix::sched::CpuSet::new();
            on_cpu.set(cpu).unwrap();
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &on_cpu).unwrap();
            let file = open_direct(&path);
            let data = AlignedBuf::from(&random_bytes(BLOCK_SIZE as usize, cpu as u64));
            let at = cpu as u64 * BLOCK_SIZE;
            file.write_all_at(data.as_ref(), at).unwrap();
            let mut back = AlignedBuf::new(BLOCK_SIZE as usize);
            file.read_exact_at(back.as_mut(), at).unwrap();
            done.send((cpu, back.as_ref() == data.as_ref())).unwrap();
        });
    }
    for _ in &online {
        let (cpu, same) = finished
            .recv_timeout(Duration::from_secs(60))
            .expect("I/O from a CPU got no answer");
        assert!(same, "CPU {cpu} read back other data");
    }
    env.assert_transport_used(&frontend);
    assert_eq!(frontend.stop().unwrap(), StopOutcome::Complete);
}
