'use strict';
// Where the server's access token comes from, in the order `spark-agent serve` itself uses:
// an explicit setting, SPARK_API_KEY, then $XDG_CONFIG_HOME/spark-agent/token (~/.config by
// default), the file the server creates on first start.

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

function tokenPath(env = process.env) {
    const base = env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME.length > 0
        ? env.XDG_CONFIG_HOME : path.join(env.HOME || os.homedir(), '.config');
    return path.join(base, 'spark-agent', 'token');
}

/** The token, or '' when none is configured or readable. */
function findToken(setting, env = process.env) {
    if (setting) return setting.trim();
    if (env.SPARK_API_KEY) return env.SPARK_API_KEY.trim();
    try {
        return fs.readFileSync(tokenPath(env), 'utf8').trim();
    } catch {
        return '';
    }
}

module.exports = { findToken, tokenPath };
