//! The lab image: the tools every fabric needs, built on this machine from Debian packages
//! (no registry), imported through the Engine API and labelled with what went into it.

mod error;
pub mod hostcopy;
pub mod import;
pub mod operator;
pub mod recipe;
pub mod rootfs;

use std::collections::BTreeMap;
use std::time::Instant;

use bollard::Docker;

use crate::engine::{Engine, is_not_found};
pub use error::ImageError;
use recipe::Recipe;

/// Label keys on the image.
pub mod label {
    pub const VERSION: &str = "iblab.version";
    pub const VARIANT: &str = "iblab.variant";
    pub const PACKAGES: &str = "iblab.packages";
    pub const RECIPE: &str = "iblab.recipe";
    pub const CONTENT: &str = "iblab.content-hash";
    pub const SUITE: &str = "iblab.suite";
    pub const MIRROR: &str = "iblab.mirror";
    pub const MISSING: &str = "iblab.missing";
    pub const BUILT: &str = "iblab.built";
}

/// Who provides the programs of a run's nodes on the docker (and kube) backends.
pub use iblab_core::images::{LAB_PROVIDER as PROVIDER, lab_carries as carries};

use iblab_core::images::lab as reference;

/// How to make the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// debootstrap --variant=minbase with the lab packages (complete; ~1 min cold, cached).
    Debootstrap,
    /// This host's tool binaries and their ldd closure (<1 s; only what the host has).
    Host,
}

impl Variant {
    /// Every variant, for the command line.
    pub const ALL: [Variant; 2] = [Variant::Debootstrap, Variant::Host];

    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Debootstrap => "debootstrap",
            Variant::Host => "host",
        }
    }
}

/// An image that exists, with its labels.
#[derive(Debug, Clone)]
pub struct Image {
    pub reference: String,
    pub id: String,
    pub size: i64,
    pub labels: BTreeMap<String, String>,
}

impl Image {
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map(String::as_str).unwrap_or("?")
    }
    /// One line: variant, when built, short id, size.
    pub fn summary(&self) -> String {
        format!(
            "{} ({} image, built {}, {} MB, id {})",
            self.reference,
            self.label(label::VARIANT),
            self.label(label::BUILT),
            self.size / 1_000_000,
            self.id
                .trim_start_matches("sha256:")
                .get(..12)
                .unwrap_or(&self.id)
        )
    }
}

/// Why an image iblab made earlier no longer serves this iblab, if it does not: a
/// Debian image without a package the lab image now lists, or a copy of this host's tools
/// without a program the quick image now copies (one a lab starts, such as lesson 3's
/// `tcpdump`). An image made by hand (no variant label) is the user's to keep.
pub fn stale(image: &Image) -> Option<String> {
    let listed = |k: &str| -> Vec<&str> {
        image
            .labels
            .get(k)
            .map(|v| v.split(',').filter(|p| !p.is_empty()).collect())
            .unwrap_or_default()
    };
    let has = listed(label::PACKAGES);
    let lacks: Vec<&str> = match image.labels.get(label::VARIANT).map(String::as_str) {
        Some("debootstrap") => recipe::PACKAGES
            .iter()
            .copied()
            .filter(|p| !has.contains(p))
            .collect(),
        Some("host") => {
            // What the host did not have then is not asked of the image now.
            let missing = listed(label::MISSING);
            hostcopy::PROGRAMS
                .iter()
                .copied()
                .filter(|p| !has.contains(p) && !missing.contains(p))
                .collect()
        }
        _ => return None,
    };
    (!lacks.is_empty()).then(|| {
        format!(
            "{} was made by an earlier iblab and lacks {}",
            image.reference,
            lacks.join(", ")
        )
    })
}

/// The image, if the engine has it.
pub async fn find(docker: &Docker, reference: &str) -> Result<Option<Image>, ImageError> {
    match docker.inspect_image(reference).await {
        Ok(i) => Ok(Some(Image {
            reference: reference.to_string(),
            id: i.id.unwrap_or_default(),
            size: i.size.unwrap_or(0),
            labels: i
                .config
                .and_then(|c| c.labels)
                .unwrap_or_default()
                .into_iter()
                .collect(),
        })),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(source) => Err(ImageError::Inspect {
            reference: reference.to_string(),
            source,
        }),
    }
}

/// What `build` should do.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub variant: Variant,
    pub suite: Option<String>,
    pub mirror: Option<String>,
    /// Make the rootfs again even when a cached one matches.
    pub rebuild: bool,
}

/// The host programs an image build starts through iblab's process layer: debootstrap and
/// tar for the Debian root filesystem, ldd and tar for a copy of this host's tools. A run
/// that builds the image on first use allows exactly these while it does
/// ([`iblab_sys::process::allowing`]); the build checks for them itself.
pub const BUILD_PROGRAMS: &[&str] = &["debootstrap", "tar", "ldd"];

/// Build and import the image; returns it and the seconds it took.
pub async fn build(
    engine: &Engine,
    opts: &BuildOptions,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(Image, f64), ImageError> {
    let t0 = Instant::now();
    let reference = reference();
    let mut labels = BTreeMap::from([
        (
            label::VERSION.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        (
            label::VARIANT.to_string(),
            opts.variant.as_str().to_string(),
        ),
        (
            label::BUILT.to_string(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        ),
    ]);
    let (tar, temporary) = match opts.variant {
        Variant::Debootstrap => {
            let r = Recipe::for_host(opts.suite.as_deref(), opts.mirror.as_deref());
            let tar = rootfs::debootstrap(&r, opts.rebuild, say).await?;
            labels.insert(label::PACKAGES.into(), r.packages.join(","));
            labels.insert(label::RECIPE.into(), r.hash());
            labels.insert(label::SUITE.into(), r.suite.clone());
            labels.insert(label::MIRROR.into(), r.mirror.clone());
            (tar, false)
        }
        Variant::Host => {
            say("copying this host's lab tools and their libraries");
            let c = hostcopy::build().await?;
            labels.insert(label::PACKAGES.into(), c.programs.join(","));
            labels.insert(label::RECIPE.into(), c.tarball.sha256.clone());
            if !c.missing.is_empty() {
                labels.insert(label::MISSING.into(), c.missing.join(","));
            }
            (c.tarball, true)
        }
    };
    labels.insert(label::CONTENT.into(), format!("sha256:{}", tar.sha256));
    let previous = find(&engine.docker, &reference).await.ok().flatten();
    say(&format!("importing {} as {reference}", tar.path.display()));
    let imported = import::import(&engine.docker, &tar.path, &reference, &labels).await;
    if temporary {
        let _ = std::fs::remove_file(&tar.path);
    }
    imported?;
    let image = find(&engine.docker, &reference)
        .await?
        .ok_or_else(|| ImageError::MissingAfterImport(reference.clone()))?;
    // The image this one replaces would linger untagged: remove it unless a container
    // still uses it.
    if let Some(old) = previous.filter(|o| o.id != image.id) {
        let _ = engine
            .docker
            .remove_image(
                &old.id,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await;
    }
    Ok((image, t0.elapsed().as_secs_f64()))
}

/// The image for a run: reused when present, built (debootstrap) on first use.
pub async fn ensure(engine: &Engine, say: &(dyn Fn(&str) + Sync)) -> Result<Image, ImageError> {
    let reference = reference();
    let mut opts = BuildOptions {
        variant: Variant::Debootstrap,
        suite: None,
        mirror: None,
        rebuild: false,
    };
    match find(&engine.docker, &reference).await? {
        Some(img) => match stale(&img) {
            None => {
                say(&format!("using lab image {}", img.summary()));
                return Ok(img);
            }
            Some(why) => {
                // Made again the way it was made: its variant, suite and mirror.
                say(&format!("{why}: making it again"));
                if img.label(label::VARIANT) == "host" {
                    opts.variant = Variant::Host;
                }
                opts.suite = img.labels.get(label::SUITE).cloned();
                opts.mirror = img.labels.get(label::MIRROR).cloned();
            }
        },
        None => say(&format!(
            "lab image {reference} not found: building it now from Debian packages (first use \
             only; `iblab image build` does this ahead of time)"
        )),
    }
    let (img, secs) = iblab_sys::process::allowing(
        "building the lab image",
        BUILD_PROGRAMS,
        build(engine, &opts, say),
    )
    .await?;
    say(&format!("built lab image {} in {secs:.1}s", img.summary()));
    Ok(img)
}

#[cfg(test)]
mod stale_tests {
    use super::*;

    fn image(labels: &[(&str, &str)]) -> Image {
        Image {
            reference: "iblab/lab:test".into(),
            id: "sha256:0".into(),
            size: 0,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn an_image_without_a_program_a_lab_now_starts_is_made_again() {
        let all = recipe::PACKAGES.join(",");
        let current = image(&[(label::VARIANT, "debootstrap"), (label::PACKAGES, &all)]);
        assert_eq!(stale(&current), None);
        let older: Vec<&str> = recipe::PACKAGES
            .iter()
            .copied()
            .filter(|p| *p != "tcpdump")
            .collect();
        let old = image(&[
            (label::VARIANT, "debootstrap"),
            (label::PACKAGES, &older.join(",")),
        ]);
        let why = stale(&old).expect("an image without tcpdump");
        assert!(why.ends_with("lacks tcpdump"), "{why}");

        let copied: Vec<&str> = hostcopy::PROGRAMS
            .iter()
            .copied()
            .filter(|p| *p != "tcpdump")
            .collect();
        let quick = image(&[
            (label::VARIANT, "host"),
            (label::PACKAGES, &copied.join(",")),
        ]);
        assert!(stale(&quick).is_some_and(|w| w.contains("tcpdump")));
        // The host had no tcpdump when it was copied: not asked for again.
        let without = image(&[
            (label::VARIANT, "host"),
            (label::PACKAGES, &copied.join(",")),
            (label::MISSING, "tcpdump"),
        ]);
        assert_eq!(stale(&without), None);
        // An image of the user's own making is theirs.
        assert_eq!(stale(&image(&[])), None);
    }
}
