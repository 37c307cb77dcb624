//! `doctor`: per backend and fabric, what this host has and how to fix what it lacks.

use super::exit;
use crate::caps::{Feature, HostCaps, TOOLS};

fn mark(ok: bool, colour: bool) -> &'static str {
    match (ok, colour) {
        (true, true) => "\x1b[32m✔\x1b[0m",
        (false, true) => "\x1b[31m✘\x1b[0m",
        (true, false) => "✔",
        (false, false) => "✘",
    }
}

fn feature(f: Feature) -> &'static str {
    match f {
        Feature::Builtin => "built in",
        Feature::Module => "module",
        Feature::Absent => "absent",
        Feature::Unknown => "unknown (no kernel config readable)",
    }
}

pub fn doctor(colour: bool) -> i32 {
    let c = HostCaps::probe();
    let tool = |p: &str| {
        let t = TOOLS.iter().find(|t| t.program == p);
        let ok = c.has(p);
        let fix = if ok {
            String::new()
        } else {
            format!(
                "  → apt-get install {}",
                t.map(|t| t.package).unwrap_or("?")
            )
        };
        format!(
            "  {} {:<20} {}{fix}",
            mark(ok, colour),
            p,
            t.map(|t| t.purpose).unwrap_or("")
        )
    };
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

    println!("\nbackend local (network namespaces)");
    println!(
        "  {} {:<20} {}",
        mark(c.netns, colour),
        "netns",
        if c.netns {
            "present"
        } else {
            "absent: the kernel lacks network namespaces"
        }
    );
    println!(
        "  {} {:<20} {}",
        mark(c.root, colour),
        "root",
        if c.root {
            "yes"
        } else {
            "no → run with sudo"
        }
    );
    println!("{}", kf("veth", c.veth, "a kernel with CONFIG_VETH"));
    println!("{}", kf("bridge", c.bridge, "a kernel with CONFIG_BRIDGE"));
    println!("{}", tool("ip"));

    println!("\nfabric ethernet (path ① tcp) and its faults");
    println!("{}", tool("iperf3"));
    println!("{}", tool("ping"));
    println!("{}", tool("tc"));
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
    println!("{}", tool("nft"));
    println!("  loss faults here use: {}", c.loss_mechanism().describe());

    println!("\nfabric softroce (path ② roce)");
    for c in crate::preflight::softroce_on_host(&c) {
        println!("{}", preflight_line(&c, colour));
    }

    println!(
        "\nfabric ibsim (path ③ ib: an emulated subnet, the real opensm and infiniband-diags)"
    );
    println!("{}", tool("ibsim"));
    println!("{}", tool("opensm"));
    println!("{}", tool("smpquery"));
    println!("{}", tool("ibtracert"));

    println!("\nfabric hca (real RDMA adapters of this host, --hca DEVICE[:PORT])");
    for line in hca_lines(&c) {
        println!("  {line}");
    }

    println!("\nbackend vm (one qemu microVM per node, a Debian kernel with rdma_rxe)");
    println!("{}", tool("qemu-system-x86_64"));
    for c in crate::preflight::softroce_in_vm() {
        println!("{}", preflight_line(&c, colour));
    }
    let missing = crate::backend::vm::image::missing_packages();
    println!(
        "  {} {:<20} {}",
        mark(missing.is_empty(), colour),
        "image packages",
        if missing.is_empty() {
            format!(
                "installed: {}",
                crate::backend::vm::image::PACKAGES.join(", ")
            )
        } else {
            format!("missing → apt-get install {}", missing.join(" "))
        }
    );
    let cache = crate::backend::vm::image::cache_dir();
    match crate::backend::vm::image::inputs() {
        Ok(i) => match crate::backend::vm::image::cached(&i) {
            Some(img) => println!(
                "  {} {:<20} cached: {} ({} {}) in {}",
                mark(true, colour),
                "image",
                img.key,
                i.kernel_package,
                i.kernel_version,
                cache.display()
            ),
            None => println!(
                "  {} {:<20} not built yet: the first vm run builds it from {} {} (a few seconds) into {}",
                mark(true, colour),
                "image",
                i.kernel_package,
                i.kernel_version,
                cache.display()
            ),
        },
        Err(e) => println!("  {} {:<20} {e}", mark(false, colour), "image"),
    }
    match crate::backend::vm::qemu::known_accel() {
        Some(a) => println!(
            "  {} {:<20} {} ({})",
            mark(true, colour),
            "accelerator",
            a.name,
            a.reason
        ),
        None => println!(
            "  {} {:<20} {}",
            mark(true, colour),
            "accelerator",
            if std::path::Path::new("/dev/kvm").exists() {
                "/dev/kvm present; the first vm run boots the guest kernel under KVM to see whether it works (else TCG)"
            } else {
                "no /dev/kvm: TCG (software emulation)"
            }
        ),
    }
    println!("\nbackend docker (containers through the Engine API)");
    for line in docker_lines(&c) {
        let (ok, name, text) = line;
        println!("  {} {:<20} {text}", mark(ok, colour), name);
    }
    println!(
        "\nbackend kube — not part of this build yet (no Kubernetes API server can be reached from here)"
    );
    exit::OK
}

/// The host's real adapters, from `ibv_devinfo -v` (sysfs says whether there are any).
fn hca_lines(c: &HostCaps) -> Vec<String> {
    let real: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !crate::fabric::hca::is_software(n))
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
    let out = std::process::Command::new("ibv_devinfo")
        .arg("-v")
        .stdin(std::process::Stdio::null())
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    match crate::tools::ibv_devinfo::parse(&text) {
        Ok(d) => crate::fabric::hca::inventory_lines(&d)
            .into_iter()
            .map(|l| format!("✔ {l}"))
            .collect(),
        Err(e) => vec![format!("✘ ibv_devinfo -v: {e}")],
    }
}

/// One preflight check as a doctor row.
pub fn preflight_line(c: &crate::preflight::Check, colour: bool) -> String {
    use crate::preflight::Mark;
    let symbol = match (c.mark, colour) {
        (Mark::Ok, _) => mark(true, colour).to_string(),
        (Mark::Fail, _) => mark(false, colour).to_string(),
        (Mark::Warn, true) => format!("\x1b[33m{}\x1b[0m", c.mark.symbol()),
        (m, _) => m.symbol().to_string(),
    };
    format!("  {symbol} {:<20} {}", c.name, c.text)
}

/// The docker backend's rows: socket, engine and API versions, the lab image and its labels.
fn docker_lines(c: &HostCaps) -> Vec<(bool, &'static str, String)> {
    use crate::backend::docker::engine;
    use crate::image::{self, label};
    let socket = engine::socket_path();
    let mut rows = vec![(
        c.docker_socket.is_some(),
        "docker socket",
        match &c.docker_socket {
            Some(p) => p.display().to_string(),
            None => format!("none at {} → {}", socket.display(), engine::FIX),
        },
    )];
    if c.docker_socket.is_none() {
        return rows;
    }
    let probed = engine::blocking(|| async {
        let e = engine::connect().await?;
        let img = image::find(&e.docker, &image::reference())
            .await
            .map_err(crate::backend::EnvError)?;
        Ok::<_, crate::backend::EnvError>((e, img))
    });
    match probed {
        Ok(Ok((e, img))) => {
            rows.push((
                true,
                "engine",
                format!("Docker {} at {}", e.version, e.socket.display()),
            ));
            let negotiated = e.docker.client_version();
            rows.push((
                true,
                "API version",
                format!(
                    "{} (engine's; iblab speaks {}.{}, needs {}.{}+)",
                    e.api,
                    negotiated.major_version,
                    negotiated.minor_version,
                    engine::MIN_API.0,
                    engine::MIN_API.1
                ),
            ));
            match img {
                Some(i) => {
                    rows.push((true, "lab image", i.summary()));
                    for k in [label::PACKAGES, label::CONTENT, label::SUITE, label::MISSING] {
                        if let Some(v) = i.labels.get(k) {
                            rows.push((true, "", format!("{k}={v}")));
                        }
                    }
                }
                None => rows.push((
                    false,
                    "lab image",
                    format!(
                        "{} not built → `sudo iblab image build` (or the first `up --backend docker` builds it)",
                        image::reference()
                    ),
                )),
            }
        }
        Ok(Err(e)) => rows.push((false, "engine", e.to_string())),
        Err(e) => rows.push((false, "engine", e)),
    }
    rows.push((
        c.has("debootstrap"),
        "debootstrap",
        if c.has("debootstrap") {
            "present (builds the lab image)".into()
        } else {
            "missing → apt-get install debootstrap (or `iblab image build --from host`)".into()
        },
    ));
    rows
}
