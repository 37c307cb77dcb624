//! `image build` and `image show`: the docker backend's lab image.

use super::{exit, runtime};
use iblab_backend_docker::engine;
use iblab_backend_docker::image::{self, BuildOptions, label};

/// Connect to the Docker engine on the command's runtime and hand it to `f`; no engine is
/// exit 3, said.
fn with_engine(f: impl AsyncFnOnce(&engine::Engine) -> i32) -> i32 {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(async {
        match engine::connect().await {
            Ok(e) => f(&e).await,
            Err(e) => {
                eprintln!("error: {e}");
                exit::ENVIRONMENT
            }
        }
    })
}

pub fn build(opts: &BuildOptions) -> i32 {
    with_engine(async |engine| {
        let reference = iblab_core::images::lab();
        if opts.variant == image::Variant::Debootstrap && !opts.rebuild {
            // Already built from the same recipe: nothing to do.
            let recipe =
                image::recipe::Recipe::for_host(opts.suite.as_deref(), opts.mirror.as_deref());
            if let Ok(Some(img)) = image::find(&engine.docker, &reference).await
                && img.labels.get(label::RECIPE) == Some(&recipe.hash())
            {
                println!("up to date: {}", img.summary());
                return exit::OK;
            }
        }
        match image::build(engine, opts, &|m| eprintln!("{m}")).await {
            Ok((img, secs)) => {
                println!("built {} in {secs:.1}s", img.summary());
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::ENVIRONMENT
            }
        }
    })
}

/// `image build --operator`: the image holds this very binary, which must then carry the
/// operator and the kube backend its runs use.
pub fn build_operator() -> i32 {
    if let Some(why) = crate::backends::left_out("kube") {
        eprintln!("error: the operator's image is this binary, and {why}");
        return exit::ENVIRONMENT;
    }
    with_engine(
        async |engine| match image::operator::build(engine, &|m| eprintln!("{m}")).await {
            Ok((img, secs)) => {
                println!("built {} in {secs:.1}s", img.summary());
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::ENVIRONMENT
            }
        },
    )
}

pub fn show() -> i32 {
    with_engine(async |engine| {
        let reference = iblab_core::images::lab();
        match image::find(&engine.docker, &reference).await {
            Ok(Some(img)) => {
                println!("{}", img.summary());
                for (k, v) in &img.labels {
                    println!("  {k}={v}");
                }
                exit::OK
            }
            Ok(None) => {
                println!(
                    "{reference} is not built yet: `iblab image build` (or `iblab up --backend docker` builds it on first use)"
                );
                exit::ENVIRONMENT
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::ENVIRONMENT
            }
        }
    })
}
