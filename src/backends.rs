//! The backends of this build: where a lab's nodes live. Each backend is a crate of its
//! own (`crates/backend-*`) that exports a [`BackendOps`]; this list is the one place that
//! names them, and the rest of iblab asks a backend what it needs (which paths it carries,
//! preflight, host programs, how to undo and sweep its resources), never matching on its
//! name. Adding a backend: one crate and one line in [`BACKENDS`] (docs/architecture.md;
//! tests/layers.rs fails while a backend crate is not listed here).

use iblab_backend::BackendOps;
use iblab_core::caps::HostCaps;
use iblab_core::plan::backend::Backend;

/// Every backend of this build, in the order `--backend auto` considers them (the kube
/// backend with its feature: [`LEFT_OUT`]).
pub static BACKENDS: &[&dyn BackendOps] = &[
    &iblab_backend_local::BACKEND,
    &iblab_backend_vm::BACKEND,
    &iblab_backend_docker::BACKEND,
    #[cfg(feature = "kube")]
    &iblab_backend_kube::BACKEND,
];

/// Backends this build leaves out, each with the cargo feature that brings it: `--backend`
/// naming one is told how to get it, not that it does not exist.
pub static LEFT_OUT: &[(&str, &str)] = &[
    #[cfg(not(feature = "kube"))]
    ("kube", "kube"),
];

/// Why `--backend NAME` cannot run in this build, with the fix, if this build left it out.
pub fn left_out(name: &str) -> Option<String> {
    LEFT_OUT
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, feature)| {
            format!(
                "the {n} backend is not part of this build of iblab (the learner's build leaves it \
             out)\n  fix: build iblab with it: `cargo build --release --features {feature}`"
            )
        })
}

/// The registered backend with this name.
pub fn named(name: &str) -> Option<&'static dyn BackendOps> {
    BACKENDS.iter().copied().find(|k| k.name() == name)
}

/// Add the Soft-RoCE preflight of the backends `requested` may resolve to (`auto`:
/// every backend auto considers). Read-only, but it runs `rdma system show` and looks at
/// kernel modules: done once, before planning.
pub fn with_preflight(mut caps: HostCaps, requested: &str) -> HostCaps {
    for k in BACKENDS {
        let wanted = if requested == "auto" || requested.is_empty() {
            k.traits().auto
        } else {
            k.name() == requested
        };
        if wanted {
            let checks = k.preflight(&caps);
            caps.preflight.insert(k.name().to_string(), checks);
        }
    }
    caps
}

/// Every registered backend as planning sees it, in the order `--backend auto` considers them.
pub fn for_planning() -> Vec<&'static dyn Backend> {
    BACKENDS.iter().map(|k| *k as &dyn Backend).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::plan::backend::{Backend, ChooseError};
    use iblab_lab::PathKind;

    /// `--backend` resolved among the registered backends.
    fn choose(
        requested: &str,
        paths: &[PathKind],
        caps: &HostCaps,
    ) -> Result<(&'static dyn Backend, String), ChooseError> {
        iblab_core::plan::backend::choose(&for_planning(), requested, paths, caps)
            .map(|c| (c.backend, c.reason))
    }

    fn caps(qemu: bool) -> HostCaps {
        let mut c = HostCaps::for_tests();
        c.netns = true;
        c.tools.insert(
            iblab_backend_vm::qemu::QEMU.into(),
            qemu.then(|| "/usr/bin/qemu-system-x86_64".into()),
        );
        c
    }

    #[test]
    fn every_backend_is_registered_once() {
        let mut names: Vec<&str> = BACKENDS.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), BACKENDS.len());
        for n in ["local", "vm", "docker"] {
            assert!(named(n).is_some(), "{n} is not registered");
        }
        // The kube backend is in the build with its feature, else named as left out.
        assert_eq!(named("kube").is_some(), cfg!(feature = "kube"));
        assert_eq!(left_out("kube").is_some(), !cfg!(feature = "kube"));
        assert!(left_out("vm").is_none());
    }

    #[test]
    fn auto_prefers_local_and_falls_back_to_vm_for_roce() {
        let c = caps(true);
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Ib], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "local", "{why}");
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "vm", "{why}");
        assert!(why.contains("local backend"), "{why}");
        // Without qemu nothing here carries roce: the vm backend, once qemu is installed
        // (`up` names qemu-system-x86, and installs it with --yes, before anything runs).
        let c = caps(false);
        let choice = iblab_core::plan::backend::choose(
            &for_planning(),
            "auto",
            &[PathKind::Tcp, PathKind::Roce],
            &c,
        )
        .ok()
        .unwrap();
        assert_eq!(choice.backend.name(), "vm", "{}", choice.reason);
        assert_eq!(choice.assumes, vec![iblab_backend_vm::qemu::QEMU]);
        assert!(
            choice.reason.contains("once qemu-system-x86 is installed")
                && choice.reason.contains("local backend"),
            "{}",
            choice.reason
        );
        // A lab local carries takes no install.
        let choice =
            iblab_core::plan::backend::choose(&for_planning(), "auto", &[PathKind::Tcp], &c)
                .ok()
                .unwrap();
        assert_eq!(choice.backend.name(), "local");
        assert!(choice.assumes.is_empty());
        // Asked for by name, the vm backend without qemu is still refused with the fix.
        assert!(
            matches!(choose("vm", &[PathKind::Roce], &c), Err(ChooseError::Unavailable(m)) if m.0.contains("apt-get install qemu-system-x86"))
        );
    }

    /// On a host kernel whose rxe serves every namespace (≥ 7.1), local and docker carry
    /// roce natively and auto prefers local; on older ones, or where it is not known, they
    /// refuse with the reason and auto goes to the vm backend. Decided on captured facts:
    /// the machines iblab is developed on have no rxe at all.
    #[test]
    fn roce_is_native_where_rxe_serves_every_namespace() {
        use iblab_core::caps::preflight::RxeNetns;
        let mut c = caps(true);
        c.rdma_rxe = iblab_core::caps::Feature::Module;
        c.rxe_netns = RxeNetns::Yes("the running kernel's symbols".into());
        c.docker_socket = Some("/run/docker.sock".into());
        assert!(named("local").unwrap().carries(PathKind::Roce, &c).is_ok());
        assert!(named("docker").unwrap().carries(PathKind::Roce, &c).is_ok());
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "local", "{why}");
        assert_eq!(named("local").unwrap().rdma_device(None, "a", 0), "a-rxe0");
        assert_eq!(
            named("local")
                .unwrap()
                .rdma_device(Some("0123456789abcdef"), "a", 0),
            "a-rxe0-0123456789abcdef"
        );
        // The kernel's limit: 63 characters, the node's name cut to fit.
        let long =
            named("docker")
                .unwrap()
                .rdma_device(Some("0123456789abcdef"), &"n".repeat(60), 1);
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("-rxe1-0123456789abcdef"));
        c.rxe_netns = RxeNetns::No("rdma_rxe.ko".into());
        let why = named("local")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(
            why.0.contains("initial network namespace") && why.0.contains("7.1"),
            "{why}"
        );
        assert!(
            named("docker")
                .unwrap()
                .carries(PathKind::Roce, &c)
                .is_err()
        );
        let (k, _) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "vm");
        c.rxe_netns = RxeNetns::Unknown("rdma_rxe.ko.xz is compressed".into());
        let why = named("local")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.0.contains("not known"), "{why}");
        c.rdma_rxe = iblab_core::caps::Feature::Absent;
        let why = named("docker")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.0.contains("no rdma_rxe"), "{why}");
    }

    #[test]
    fn unknown_and_unavailable_backends_are_told_apart() {
        let c = caps(false);
        assert!(
            matches!(choose("nope", &[], &c), Err(ChooseError::Unknown(m)) if m.contains("local, vm, docker"))
        );
        assert!(
            matches!(choose("vm", &[], &c), Err(ChooseError::Unavailable(m)) if m.0.contains("qemu"))
        );
        // kube plans without a cluster (reaching one is provisioning's business), and
        // says why it carries no roce.
        if !cfg!(feature = "kube") {
            return;
        }
        assert!(choose("kube", &[], &c).is_ok());
        let why = named("kube")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.0.contains("7.1") && why.0.contains("--paths"), "{why}");
    }

    /// A host with every program iblab knows installed, whose kernel's rxe serves every
    /// namespace, with qemu and a Docker engine: every backend can plan every path it
    /// carries.
    fn full_host() -> iblab_core::caps::HostCaps {
        let mut c = iblab_core::caps::HostCaps::for_tests();
        for t in iblab_core::caps::TOOLS {
            c.tools.insert(
                t.program.into(),
                Some(format!("/usr/bin/{}", t.program).into()),
            );
        }
        c.rdma_rxe = iblab_core::caps::Feature::Module;
        c.rxe_netns = iblab_core::caps::preflight::RxeNetns::Yes("test".into());
        c.docker_socket = Some("/run/docker.sock".into());
        c
    }

    /// Every built-in lab, in every scenario, on every backend, with every set of its
    /// paths that backend carries: each program the run starts is listed where it runs,
    /// and is one this host can install (a package iblab knows), iblab itself, or one the
    /// backend's image carries. A program added to a command builder without a package or
    /// outside an image fails here.
    #[test]
    fn every_builtin_plan_lists_programs_a_host_or_an_image_provides() {
        let caps = full_host();
        let mut plans = 0;
        for b in iblab_lab::builtin::all() {
            let loaded = iblab_lab::load::load_str(b.name, b.text).unwrap();
            let lab = &loaded.lab;
            let scenarios: Vec<Option<String>> = std::iter::once(None)
                .chain(lab.spec.scenarios.keys().map(|k| Some(k.clone())))
                .collect();
            let paths = &lab.spec.paths;
            let subsets: Vec<Vec<iblab_lab::PathKind>> = (1..(1u32 << paths.len()))
                .map(|m| {
                    paths
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| m & (1 << i) != 0)
                        .map(|(_, p)| *p)
                        .collect()
                })
                .collect();
            for backend in BACKENDS {
                for scenario in &scenarios {
                    for set in &subsets {
                        let req = iblab_core::plan::Request {
                            scenario: scenario.clone(),
                            backend: backend.name().into(),
                            paths: Some(set.clone()),
                            hca: None,
                            run: None,
                            lang: Default::default(),
                        };
                        let plan =
                            match iblab_core::plan::plan(&loaded, &req, &caps, &for_planning()) {
                                Ok(p) => p,
                                // A path this backend does not carry (roce in pods).
                                Err(iblab_core::plan::PlanError::Environment(_)) => continue,
                                Err(e) => panic!("{} {scenario:?} {}: {e}", b.name, backend.name()),
                            };
                        plans += 1;
                        let needs = iblab_engine::run::programs::of(&plan, *backend);
                        let what = format!(
                            "{} scenario {scenario:?} on {} with {set:?}",
                            b.name,
                            backend.name()
                        );
                        for n in needs.all() {
                            if iblab_engine::run::programs::is_iblab(*backend, &n.program) {
                                continue;
                            }
                            // The quick (host-copy) image must carry it too: it runs the
                            // built-in labs in CI and for anyone who picks it.
                            if backend.name() == "docker"
                                && n.place == iblab_core::programs::Place::Nodes
                            {
                                let p = iblab_core::programs::base(&n.program);
                                assert!(
                                    iblab_backend_docker::image::hostcopy::PROGRAMS.contains(&p),
                                    "{what}: {} starts `{p}`, which the quick image does not copy",
                                    n.by
                                );
                            }
                            match backend.provider(n.place) {
                                iblab_core::programs::Provider::Host => assert!(
                                    iblab_core::caps::package_of(iblab_core::programs::base(
                                        &n.program
                                    ))
                                    .is_some(),
                                    "{what}: {} starts `{}` on this host, and no package is known for it",
                                    n.by,
                                    n.program
                                ),
                                iblab_core::programs::Provider::Image { what: image, has } => {
                                    assert!(
                                        has(iblab_core::programs::base(&n.program)),
                                        "{what}: {} starts `{}`, which {image} lacks",
                                        n.by,
                                        n.program
                                    )
                                }
                            }
                        }
                        // Each command a step names, and the link check's ping.
                        for s in plan.steps.iter().filter(|s| s.skip.is_none()) {
                            if let iblab_core::plan::Action::Exec { argv, .. } = &s.action {
                                let p = iblab_core::programs::program_of(argv).unwrap();
                                assert!(
                                    needs.has(iblab_core::programs::Place::Nodes, p)
                                        || iblab_engine::run::programs::is_iblab(*backend, p),
                                    "{what}: {p}"
                                );
                            }
                        }
                        if !iblab_engine::run::linkcheck::probes(&plan.nodes).is_empty() {
                            assert!(
                                needs.has(iblab_core::programs::Place::Nodes, "ping"),
                                "{what}: no ping"
                            );
                        }
                        assert_eq!(
                            iblab_engine::run::programs::missing(*backend, &needs, &caps)
                                .map(|m| m.len()),
                            Ok(0),
                            "{what}"
                        );
                    }
                }
            }
        }
        assert!(plans > 100, "only {plans} plans");
    }
}
