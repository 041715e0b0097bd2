//! Heap in use (glibc `mallinfo2`) as the engine takes in N realistic services (default
//! 10,000: two slices of five endpoints each, with targetRef, zone and hints) and syncs them
//! to maps outside the process: what the agent's model and reconciler hold per service.
use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use socklb::{
    agent::Engine,
    model::{service_from_api, slice_from_api},
    reconcile::Reconciler,
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
    vocab::Kind,
};
use socklb_tests::bench::controlplane::Discard;

fn in_use_mib() -> f64 {
    // SAFETY: reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks as f64 / (1024.0 * 1024.0)
}

fn main() -> anyhow::Result<()> {
    let services: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let base = in_use_mib();
    let (mut svcs, mut slices) = (Vec::new(), Vec::new());
    // As the API server serves them: each with its resourceVersion, a decimal integer.
    let mut rv = 4_000_000u64;
    let mut versioned = |mut o: serde_json::Value| {
        rv += 1;
        o["metadata"]["resourceVersion"] = rv.to_string().into();
        o
    };
    for i in 0..services {
        let mut objects = socklb_tests::bench::controlplane::realistic_objects(i, 5)
            .into_iter()
            .map(&mut versioned);
        let svc: core::Service = serde_json::from_value(objects.next().expect("service"))?;
        svcs.push(Object::Service(Box::new(service_from_api(&svc)?)));
        for mut o in objects {
            let strip = std::env::var("STRIP").unwrap_or_default();
            if let Some(eps) = o["endpoints"].as_array_mut() {
                for e in eps {
                    for field in strip.split(',').filter(|f| !f.is_empty()) {
                        e.as_object_mut().expect("endpoint").remove(field);
                    }
                }
            }
            let sl: discovery::EndpointSlice = serde_json::from_value(o)?;
            slices.push(Object::EndpointSlice(Box::new(slice_from_api(&sl)?)));
        }
    }
    let model = in_use_mib();
    eprintln!(
        "model objects: {:.1} MiB ({:.2} KiB per service)",
        model - base,
        (model - base) * 1024.0 / services as f64
    );
    let flags = NodeFlags {
        proxy_name: DEFAULT_PROXY_NAME.into(),
        ..NodeFlags::default()
    };
    let mut engine = Engine::new(Reconciler::new(Discard)?, flags);
    engine.handle(SourceEvent::Listed {
        kind: Kind::Service,
        objects: svcs,
        keep: Vec::new(),
    });
    engine.handle(SourceEvent::Listed {
        kind: Kind::EndpointSlice,
        objects: slices,
        keep: Vec::new(),
    });
    let stored = in_use_mib();
    eprintln!("in the engine's store: {:.1} MiB", stored - base);
    engine.reconcile();
    let synced = in_use_mib();
    eprintln!(
        "after the full sync: {:.1} MiB ({:.2} KiB per service; the maps themselves are outside the process)",
        synced - base,
        (synced - base) * 1024.0 / services as f64
    );
    Ok(())
}
