#!/usr/bin/env node
import { runProcess } from '../dist/main.js';

runProcess(process.argv);
