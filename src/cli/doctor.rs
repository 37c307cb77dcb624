//! `doctor`: per backend and fabric, what this host has and how to fix what it lacks.

use super::exit;
use iblab_core::caps::{Feature, HostCaps, TOOLS};
use iblab_report::describe::{mark, preflight_line};

fn feature(f: Feature) -> &'static str {
    match f {
        Feature::Builtin => "built in",
        Feature::Module => "module",
        Feature::Absent => "absent",
        Feature::Unknown => "unknown (no kernel config readable)",
    }
}

/// `doctor`: this host per fabric and backend; with a lab, also every program a run of it
/// would start (the list `plan` shows and `up` installs from).
pub fn doctor(colour: bool, lab: Option<&super::Selection>) -> i32 {
    let c = iblab_sys::host::probe();
    let kf = |name: &str, f: Feature, fix: &str| {
        let fixs = if f.usable() {
            String::new()
        } else {
            format!("  → {fix}")
        };
        format!(
            "  {} {:<20} {}{fixs}",
            mark(f.usable(), colour),
            name,
            feature(f)
        )
    };
    println!(
        "host: kernel {} · {}",
        c.kernel,
        if c.root {
            "running as root"
        } else {
            "not root (the local backend needs root)"
        }
    );

    println!("\nfabric ethernet (path ① tcp) and its faults");
    println!(
        "{}",
        kf(
            "tbf (rate faults)",
            c.tbf,
            "a kernel with CONFIG_NET_SCH_TBF"
        )
    );
    println!(
        "{}",
        kf(
            "netem (loss faults)",
            c.netem,
            "optional: without it loss uses nftables"
        )
    );
    println!(
        "{}",
        kf(
            "nft egress hook",
            c.nft_egress,
            "a kernel ≥ 5.16 with CONFIG_NETFILTER_EGRESS (needed when there is no netem)"
        )
    );
    println!("  loss faults here use: {}", c.loss_mechanism().describe());

    println!("\nfabric softroce (path ② roce)");
    for c in iblab_sys::host::softroce_on_host(&c) {
        println!("{}", preflight_line(&c, colour));
    }

    println!("\nfabric hca (real RDMA adapters of this host, --hca DEVICE[:PORT])");
    for line in hca_lines(&c) {
        println!("  {line}");
    }

    // What the built-in labs start on this host's own programs (the local backend's
    // nodes, path ③'s subnet): the same list `plan` shows and `up --yes` installs from.
    println!(
        "\nprograms the built-in labs start on this host (local backend, paths it carries here)"
    );
    for line in builtin_programs(&c, colour) {
        println!("{line}");
    }

    for k in crate::backends::BACKENDS {
        println!("\nbackend {} ({})", k.name(), k.about());
        for c in k.doctor(&c) {
            println!("{}", preflight_line(&c, colour));
        }
    }
    match lab {
        Some(sel) => lab_programs(sel, c, colour),
        None => exit::OK,
    }
}

/// One program this host must have, as a doctor row: found, or the package to install.
fn program_line(c: &HostCaps, program: &str, by: &str, colour: bool) -> (bool, String) {
    let t = TOOLS.iter().find(|t| t.program == program);
    let ok = c.has(program) || (t.is_none() && iblab_sys::host::which(program).is_some());
    let fix = if ok {
        String::new()
    } else {
        match t {
            Some(t) => format!("  → apt-get install {}", t.package),
            None => "  → install it".into(),
        }
    };
    let purpose = t.map(|t| t.purpose).unwrap_or("");
    (
        ok,
        format!(
            "  {} {:<20} {purpose} ({by}){fix}",
            mark(ok, colour),
            program
        ),
    )
}

/// Every program the built-in labs start from this host's programs, planned on the local
/// backend with the paths it carries here.
fn builtin_programs(c: &HostCaps, colour: bool) -> Vec<String> {
    use iblab_core::programs::Needs;
    let local = crate::backends::named("local");
    let mut all: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for b in iblab_lab::builtin::all() {
        let Ok(loaded) = iblab_lab::load::load_str(b.name, b.text) else {
            continue;
        };
        let paths: Vec<_> = loaded
            .lab
            .spec
            .paths
            .iter()
            .copied()
            .filter(|p| local.is_some_and(|k| k.carries(*p, c).is_ok()))
            .collect();
        let req = iblab_core::plan::Request {
            backend: "local".into(),
            paths: Some(paths),
            ..Default::default()
        };
        let Ok(plan) = iblab_core::plan::plan(&loaded, &req, c, &crate::backends::for_planning())
        else {
            continue;
        };
        let Some(k) = local else { continue };
        let needs: Needs = iblab_engine::run::programs::of(&plan, k);
        for n in needs.all() {
            let e = all.entry(n.program.clone()).or_default();
            if !e.contains(&n.by) {
                e.push(n.by.clone());
            }
        }
    }
    all.into_iter()
        .filter(|(p, _)| local.is_none_or(|k| !iblab_engine::run::programs::is_iblab(k, p)))
        .map(|(p, by)| program_line(c, &p, &by.join(", "), colour).1)
        .collect()
}

/// `doctor LAB`: every program a run of the lab would start, where, and whether it is
/// there (exit 3 when something is missing).
fn lab_programs(sel: &super::Selection, mut c: HostCaps, colour: bool) -> i32 {
    use iblab_core::programs::{Place, Provider};
    let plan = match super::planning::make_plan(sel, &mut c, colour, None) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let Some(k) = crate::backends::named(&plan.backend) else {
        return exit::OK;
    };
    let needs = iblab_engine::run::programs::of(&plan, k);
    println!(
        "\nlab {} · scenario {} · backend {}: the programs a run starts",
        plan.lab, plan.scenario, plan.backend
    );
    let mut all_ok = true;
    for place in [Place::Host, Place::Nodes, Place::Subnet] {
        for n in needs.all().iter().filter(|n| n.place == place) {
            if iblab_engine::run::programs::is_iblab(k, &n.program) {
                println!(
                    "  {} {:<20} iblab itself ({})",
                    mark(true, colour),
                    n.program,
                    n.by
                );
                continue;
            }
            match k.provider(place) {
                Provider::Host => {
                    let (ok, line) = program_line(&c, &n.program, &n.by, colour);
                    all_ok &= ok;
                    println!("{line}");
                }
                Provider::Image { what, has } => {
                    let ok = has(&n.program);
                    all_ok &= ok;
                    println!(
                        "  {} {:<20} in {what} ({}){}",
                        mark(ok, colour),
                        n.program,
                        n.by,
                        if ok {
                            ""
                        } else {
                            "  → a bug in iblab: please report it"
                        }
                    );
                }
            }
        }
    }
    for p in k.missing_packages() {
        all_ok = false;
        println!(
            "  {} {:<20} a package the {} backend prepares from  → apt-get install {p}",
            mark(false, colour),
            p,
            k.name()
        );
    }
    if all_ok { exit::OK } else { exit::ENVIRONMENT }
}

/// The host's real adapters, from `ibv_devinfo -v` (sysfs says whether there are any).
fn hca_lines(c: &HostCaps) -> Vec<String> {
    let real: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !iblab_core::plan::hca::is_software(n))
                .collect()
        })
        .unwrap_or_default();
    if real.is_empty() {
        return vec![
            "· none on this host: ② and ③ run on softroce (rxe) and the emulated subnet".into(),
        ];
    }
    if !c.has("ibv_devinfo") {
        return vec![format!(
            "· {} (install ibverbs-utils to see their ports, rates and GIDs)",
            real.join(", ")
        )];
    }
    let out = iblab_sys::process::output_within(
        std::process::Command::new("ibv_devinfo").arg("-v"),
        std::time::Duration::from_secs(10),
    );
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    match iblab_tools::ibv_devinfo::parse(&text) {
        Ok(d) => iblab_fabric::hca::inventory_lines(&d)
            .into_iter()
            .map(|l| format!("✔ {l}"))
            .collect(),
        Err(e) => vec![format!("✘ ibv_devinfo -v: {e}")],
    }
}
