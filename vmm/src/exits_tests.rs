use super::*;

fn bus() -> Bus {
    Bus::new(64 << 20)
}

#[test]
fn guest_ports_map_to_their_actions() {
    let c = ExitCounters::default();
    let out = |port, value| dispatch(&Exit::IoOut { port, value }, &bus(), &c);
    assert_eq!(out(abi::PORT_READY, 0), Action::Ready);
    assert_eq!(out(abi::PORT_DONE, 7), Action::Done);
    assert_eq!(out(abi::PORT_PHASE, 0x305), Action::Phase(0x305));
    assert_eq!(out(abi::PORT_CONSOLE, 12), Action::Console(12));
    assert_eq!(out(abi::PORT_PANIC, 40), Action::Panic(40));
    assert_eq!(out(abi::PORT_EXIT_TEST, 1), Action::Resume);
    assert_eq!(c.reason(Reason::IoOut), 6);
    assert_eq!(c.device(Device::Phase), 1);
}

#[test]
fn unknown_port_is_a_fault_naming_the_port() {
    let c = ExitCounters::default();
    let a = dispatch(
        &Exit::IoOut {
            port: 0x80,
            value: 0,
        },
        &bus(),
        &c,
    );
    assert_eq!(
        a,
        Action::Fault(Fault::UnhandledPort {
            port: 0x80,
            write: true
        })
    );
    assert!(matches!(&a, Action::Fault(f) if f.to_string().contains("0x80")));
    assert_eq!(c.device(Device::Unhandled), 1);
    let a = dispatch(
        &Exit::IoIn {
            port: abi::PORT_READY,
        },
        &bus(),
        &c,
    );
    assert_eq!(
        a,
        Action::Fault(Fault::UnhandledPort {
            port: abi::PORT_READY,
            write: false
        })
    );
}

#[test]
fn mmio_test_page_resumes_and_other_addresses_fault() {
    let c = ExitCounters::default();
    let b = bus();
    assert_eq!(
        dispatch(&Exit::MmioWrite { addr: 64 << 20 }, &b, &c),
        Action::Resume
    );
    assert_eq!(
        dispatch(
            &Exit::MmioRead {
                addr: (64 << 20) + 4095
            },
            &b,
            &c
        ),
        Action::Resume
    );
    assert_eq!(
        dispatch(
            &Exit::MmioWrite {
                addr: (64 << 20) + 4096
            },
            &b,
            &c
        ),
        Action::Fault(Fault::UnhandledMmio {
            addr: (64 << 20) + 4096,
            write: true
        })
    );
    assert_eq!(c.device(Device::MmioTest), 2);
    assert_eq!(
        (c.reason(Reason::MmioWrite), c.reason(Reason::MmioRead)),
        (2, 1)
    );
}

#[test]
fn fatal_exits_become_faults() {
    let c = ExitCounters::default();
    let b = bus();
    assert_eq!(
        dispatch(&Exit::Shutdown, &b, &c),
        Action::Fault(Fault::TripleFault)
    );
    assert_eq!(
        dispatch(&Exit::InternalError { suberror: 1 }, &b, &c),
        Action::Fault(Fault::InternalError { suberror: 1 })
    );
    assert_eq!(
        dispatch(
            &Exit::FailEntry {
                reason: 0x21,
                cpu: 1
            },
            &b,
            &c
        ),
        Action::Fault(Fault::FailedEntry {
            reason: 0x21,
            cpu: 1
        })
    );
    assert_eq!(dispatch(&Exit::Hlt, &b, &c), Action::Fault(Fault::Halted));
    assert_eq!(dispatch(&Exit::Interrupted, &b, &c), Action::Interrupted);
    assert_eq!(c.total(), 5);
}

#[test]
fn counters_serialise_every_reason_and_device() {
    let c = ExitCounters::default();
    dispatch(
        &Exit::IoOut {
            port: abi::PORT_EXIT_TEST,
            value: 0,
        },
        &bus(),
        &c,
    );
    let j = c.to_json();
    assert_eq!(j["reasons"]["io_out"], 1);
    assert_eq!(j["devices"]["exit_test_port"], 1);
    assert_eq!(j["reasons"].as_object().unwrap().len(), Reason::ALL.len());
    assert_eq!(j["total"], 1);
}

#[test]
fn internal_errors_name_their_suberror() {
    let text = |suberror| Fault::InternalError { suberror }.to_string();
    assert_eq!(
        text(1),
        "KVM internal error, suberror 1 (emulation failure)"
    );
    assert!(text(2).ends_with("(simultaneous exceptions)"));
    assert!(text(3).ends_with("(an exit during event delivery)"));
    assert!(text(4).ends_with("(unexpected exit reason)"));
    assert!(text(99).ends_with("suberror 99 (unknown suberror)"));
}
